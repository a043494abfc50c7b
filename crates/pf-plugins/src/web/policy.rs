//! The fetch policy: URL admission rules and the blocked address table.
//!
//! Every URL the fetch tool reaches, the first one and every redirect target,
//! passes [`admit`]; every address a host name resolves to passes
//! [`address_allowed`] before any connection is made.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use url::{Host, Url};

/// Why a URL was refused, and whether the refusal fails the call (hard) or
/// comes back as result text (soft).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub message: String,
    pub hard: bool,
}

impl Refusal {
    fn hard(message: impl Into<String>) -> Self {
        Refusal {
            message: message.into(),
            hard: true,
        }
    }
    fn soft(message: impl Into<String>) -> Self {
        Refusal {
            message: message.into(),
            hard: false,
        }
    }
}

/// The host a URL names, after admission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TargetHost {
    /// A DNS name, resolved (and vetted) before each request.
    Name(String),
    /// An IP literal; only loopback ones, and only when loopback is allowed.
    Address(IpAddr),
}

/// A URL that passed admission, without its fragment.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub url: Url,
    pub host: TargetHost,
    /// Set when only `allow_loopback` let the URL through (plain http or a port
    /// other than 80/443): the rule it broke, which still holds unless the host
    /// turns out to be loopback. A name is judged once resolved.
    pub loopback_only: Option<Refusal>,
}

/// Parses and admits a URL: parse, scheme, credentials, port, host, in that
/// order, reporting only the first broken rule.
pub(crate) fn admit_text(text: &str, allow_loopback: bool) -> Result<Target, Refusal> {
    let url = Url::parse(text).map_err(|_| Refusal::hard("invalid url"))?;
    admit(url, allow_loopback)
}

/// Admits an already parsed URL (a redirect target).
pub(crate) fn admit(mut url: Url, allow_loopback: bool) -> Result<Target, Refusal> {
    let scheme = url.scheme().to_string();
    // Loopback test servers speak plain http on any port, so the test switch
    // lets those through, for loopback hosts only.
    let mut loopback_only = None;
    if scheme != "https" {
        let refusal = Refusal::soft(format!("scheme not allowed: {scheme}"));
        if !(allow_loopback && scheme == "http") {
            return Err(refusal);
        }
        loopback_only = Some(refusal);
    }
    let host = match url.host() {
        Some(host) => host.to_owned(),
        None => return Err(Refusal::hard("invalid url")),
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Refusal::hard("url must not contain userinfo"));
    }
    let port = url.port_or_known_default().unwrap_or(0);
    if port != 80 && port != 443 {
        let refusal = Refusal::hard(format!("port not allowed: {port}"));
        if !allow_loopback {
            return Err(refusal);
        }
        loopback_only.get_or_insert(refusal);
    }
    let host = match host {
        Host::Domain(name) => TargetHost::Name(name),
        Host::Ipv4(v4) => literal_host(IpAddr::V4(v4), allow_loopback, &loopback_only)?,
        Host::Ipv6(v6) => literal_host(IpAddr::V6(v6), allow_loopback, &loopback_only)?,
    };
    if matches!(host, TargetHost::Address(_)) {
        // A loopback literal: the loosened rules were meant for it.
        loopback_only = None;
    }
    url.set_fragment(None);
    Ok(Target {
        url,
        host,
        loopback_only,
    })
}

/// Keeps only loopback addresses for a target that `allow_loopback` alone
/// admitted; with none, the rule it broke applies after all.
pub(crate) fn loopback_addresses(
    target: &Target,
    addresses: Vec<IpAddr>,
) -> Result<Vec<IpAddr>, Refusal> {
    let Some(refusal) = &target.loopback_only else {
        return Ok(addresses);
    };
    let loopback: Vec<IpAddr> = addresses
        .into_iter()
        .filter(|address| is_allowed_loopback(*address))
        .collect();
    if loopback.is_empty() {
        Err(refusal.clone())
    } else {
        Ok(loopback)
    }
}

fn literal_host(
    address: IpAddr,
    allow_loopback: bool,
    loopback_only: &Option<Refusal>,
) -> Result<TargetHost, Refusal> {
    if allow_loopback && is_allowed_loopback(address) {
        return Ok(TargetHost::Address(address));
    }
    // Not loopback: the strict rules apply in their order, so a loosened
    // scheme or port is what gets reported first.
    match loopback_only {
        Some(refusal) => Err(refusal.clone()),
        None => Err(Refusal::hard(format!(
            "ip literal host not allowed: {address}"
        ))),
    }
}

/// Scheme, host, port and path only: no credentials, query or fragment.
pub(crate) fn display_url(url: &Url) -> String {
    let host = url.host_str().unwrap_or("");
    match url.port() {
        Some(port) => format!("{}://{}:{}{}", url.scheme(), host, port, url.path()),
        None => format!("{}://{}{}", url.scheme(), host, url.path()),
    }
}

/// The URL as requested (query kept), without a fragment.
pub(crate) fn requested_url(url: &Url) -> String {
    let mut url = url.clone();
    url.set_fragment(None);
    url.to_string()
}

/// The only addresses `allow_loopback` opens: 127.0.0.0/8 and ::1.
fn is_allowed_loopback(address: IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => v4.octets()[0] == 127,
        IpAddr::V6(v6) => v6 == Ipv6Addr::LOCALHOST,
    }
}

/// True when a fetch may connect to `address`.
pub(crate) fn address_allowed(address: IpAddr, allow_loopback: bool) -> bool {
    if allow_loopback && is_allowed_loopback(address) {
        return true;
    }
    match address {
        IpAddr::V4(v4) => !v4_blocked(v4),
        IpAddr::V6(v6) => !v6_blocked(v6),
    }
}

/// Every IPv4 range that is not globally reachable (IANA special-purpose registry).
const BLOCKED_V4: [([u8; 4], u32); 16] = [
    ([0, 0, 0, 0], 8),
    ([10, 0, 0, 0], 8),
    ([100, 64, 0, 0], 10),
    ([127, 0, 0, 0], 8),
    ([169, 254, 0, 0], 16),
    ([172, 16, 0, 0], 12),
    ([192, 0, 0, 0], 24),
    ([192, 0, 2, 0], 24),
    ([192, 88, 99, 0], 24),
    ([192, 168, 0, 0], 16),
    ([198, 18, 0, 0], 15),
    ([198, 51, 100, 0], 24),
    ([203, 0, 113, 0], 24),
    ([224, 0, 0, 0], 4),
    ([240, 0, 0, 0], 4),
    ([255, 255, 255, 255], 32),
];

/// Every IPv6 range that is not globally reachable, including the IPv4-mapped
/// and IPv4-compatible forms as whole ranges.
const BLOCKED_V6: [([u16; 8], u32); 14] = [
    ([0, 0, 0, 0, 0, 0, 0, 0], 128),
    ([0, 0, 0, 0, 0, 0, 0, 1], 128),
    ([0, 0, 0, 0, 0, 0, 0, 0], 96),
    ([0, 0, 0, 0, 0, 0xffff, 0, 0], 96),
    ([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96),
    ([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48),
    ([0x100, 0, 0, 0, 0, 0, 0, 0], 64),
    ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32),
    ([0x2002, 0, 0, 0, 0, 0, 0, 0], 16),
    ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),
    ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),
    ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10),
    ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10),
    ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8),
];

fn v4_blocked(address: Ipv4Addr) -> bool {
    let value = u32::from(address);
    BLOCKED_V4.iter().any(|(network, prefix)| {
        let shift = 32 - prefix;
        value.checked_shr(shift).unwrap_or(0)
            == u32::from(Ipv4Addr::from(*network))
                .checked_shr(shift)
                .unwrap_or(0)
    })
}

fn v6_blocked(address: Ipv6Addr) -> bool {
    let value = u128::from(address);
    BLOCKED_V6.iter().any(|(segments, prefix)| {
        let shift = 128 - prefix;
        let network = u128::from(Ipv6Addr::from(*segments));
        value.checked_shr(shift).unwrap_or(0) == network.checked_shr(shift).unwrap_or(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(text: &str) -> Refusal {
        match admit_text(text, false) {
            Ok(target) => panic!("{text} was admitted as {}", target.url),
            Err(refusal) => refusal,
        }
    }

    #[test]
    fn admission_rules_run_in_order() {
        assert_eq!(refusal("not a url"), Refusal::hard("invalid url"));
        assert_eq!(
            refusal("http://user:pass@example.com:8080/"),
            Refusal::soft("scheme not allowed: http")
        );
        assert_eq!(
            refusal("ftp://example.com/"),
            Refusal::soft("scheme not allowed: ftp")
        );
        assert_eq!(
            refusal("https://user:pass@example.com:8080/"),
            Refusal::hard("url must not contain userinfo")
        );
        assert_eq!(
            refusal("https://example.com:8080/"),
            Refusal::hard("port not allowed: 8080")
        );
        assert_eq!(
            refusal("https://127.0.0.1/"),
            Refusal::hard("ip literal host not allowed: 127.0.0.1")
        );
    }

    #[test]
    fn every_ip_literal_notation_is_refused_in_canonical_form() {
        for (text, shown) in [
            ("https://0177.0.0.1/", "127.0.0.1"),
            ("https://2130706433/", "127.0.0.1"),
            ("https://127.1/", "127.0.0.1"),
            ("https://[::1]/", "::1"),
            ("https://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1"),
            ("https://10.0.0.1/", "10.0.0.1"),
            ("https://169.254.169.254/", "169.254.169.254"),
            ("https://1.1.1.1/", "1.1.1.1"),
        ] {
            assert_eq!(
                refusal(text),
                Refusal::hard(format!("ip literal host not allowed: {shown}")),
                "{text}"
            );
        }
    }

    #[test]
    fn accepted_url_drops_fragment_and_keeps_query() {
        let target = admit_text("https://Example.com/path?q=1#frag", false).expect("admitted");
        assert_eq!(target.url.as_str(), "https://example.com/path?q=1");
        assert_eq!(target.host, TargetHost::Name("example.com".into()));
        let target = admit_text("https://example.com:443/", false).expect("admitted");
        assert_eq!(target.url.as_str(), "https://example.com/");
        let target = admit_text("https://example.com:80/", false).expect("admitted");
        assert_eq!(target.url.as_str(), "https://example.com:80/");
    }

    #[test]
    fn loopback_switch_opens_only_loopback_literals_and_plain_http() {
        let target = admit_text("http://127.0.0.1:8080/a", true).expect("admitted");
        assert_eq!(
            target.host,
            TargetHost::Address(IpAddr::V4(Ipv4Addr::LOCALHOST))
        );
        assert!(target.loopback_only.is_none());
        assert!(admit_text("http://[::1]:9/", true).is_ok());
        // A host that is not loopback keeps the strict rules, in their order.
        assert_eq!(
            admit_text("http://10.0.0.1/", true).err(),
            Some(Refusal::soft("scheme not allowed: http"))
        );
        assert_eq!(
            admit_text("https://10.0.0.1:8443/", true).err(),
            Some(Refusal::hard("port not allowed: 8443"))
        );
        assert_eq!(
            admit_text("https://10.0.0.1/", true).err(),
            Some(Refusal::hard("ip literal host not allowed: 10.0.0.1"))
        );
        assert_eq!(
            admit_text("https://[::ffff:127.0.0.1]/", true).err(),
            Some(Refusal::hard(
                "ip literal host not allowed: ::ffff:127.0.0.1"
            ))
        );
        // A name is judged once resolved: the loosened rule waits on the target.
        let named = admit_text("https://example.com:8080/", true).expect("admitted");
        assert_eq!(
            named.loopback_only,
            Some(Refusal::hard("port not allowed: 8080"))
        );
        let public: IpAddr = "93.184.216.34".parse().expect("address");
        let local: IpAddr = "127.0.0.1".parse().expect("address");
        assert_eq!(
            loopback_addresses(&named, vec![public]).err(),
            Some(Refusal::hard("port not allowed: 8080"))
        );
        assert_eq!(
            loopback_addresses(&named, vec![public, local]).ok(),
            Some(vec![local])
        );
        let plain = admit_text("https://example.com/", true).expect("admitted");
        assert_eq!(
            loopback_addresses(&plain, vec![public]).ok(),
            Some(vec![public])
        );
        assert_eq!(
            admit_text("ftp://127.0.0.1/", true).err(),
            Some(Refusal::soft("scheme not allowed: ftp"))
        );
    }

    #[test]
    fn display_url_keeps_scheme_host_port_and_path_only() {
        let url = Url::parse("https://user:pass@host.example:8443/a/b?x=secret#frag").expect("url");
        assert_eq!(display_url(&url), "https://host.example:8443/a/b");
        assert_eq!(
            requested_url(&url),
            "https://user:pass@host.example:8443/a/b?x=secret"
        );
    }

    fn allowed(text: &str) -> bool {
        address_allowed(text.parse().expect("address"), false)
    }

    #[test]
    fn blocked_ranges_cover_their_first_and_last_addresses() {
        for text in [
            "0.0.0.0",
            "10.0.0.0",
            "10.255.255.255",
            "100.64.0.0",
            "100.127.255.255",
            "127.0.0.1",
            "169.254.169.254",
            "172.16.0.0",
            "172.31.255.255",
            "192.0.0.1",
            "192.0.2.1",
            "192.88.99.1",
            "192.168.1.1",
            "198.18.0.0",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.255",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::169.254.169.254",
            "::ffff:169.254.169.254",
            "::ffff:1.1.1.1",
            "64:ff9b::7f00:1",
            "64:ff9b:1::1",
            "100::1",
            "2001:db8::1",
            "2002::1",
            "3fff::1",
            "3fff:fff::1",
            "fc00::",
            "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "fe80::1",
            "fec0::1",
            "ff02::1",
        ] {
            assert!(!allowed(text), "{text} should be blocked");
        }
    }

    #[test]
    fn public_addresses_next_to_blocked_ranges_are_allowed() {
        for text in [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.216.34",
            "11.0.0.0",
            "172.32.0.0",
            "223.255.255.255",
            "100.128.0.0",
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "2001:db9::1",
            "3fff:1000::1",
        ] {
            assert!(allowed(text), "{text} should be allowed");
        }
    }

    #[test]
    fn loopback_switch_opens_loopback_only() {
        let open = |text: &str| address_allowed(text.parse().expect("address"), true);
        assert!(open("127.0.0.1"));
        assert!(open("127.255.0.9"));
        assert!(open("::1"));
        assert!(!open("10.0.0.1"));
        assert!(!open("169.254.169.254"));
        assert!(!open("::ffff:127.0.0.1"));
        assert!(!open("0.0.0.0"));
        assert!(!open("fe80::1"));
    }
}
