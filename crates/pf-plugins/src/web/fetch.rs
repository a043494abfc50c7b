//! The fetch tool: one GET under the fetch policy, redirects followed by hand
//! so every hop is admitted and every address vetted before connecting.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use pf_harness::ToolFailure;
use reqwest::header::{CONTENT_TYPE, LOCATION};
use serde_json::Value as Json;
use tokio::time::Instant;
use url::Url;

use super::extract::{self, BodyKind, Extraction};
use super::policy::{self, Refusal, Target, TargetHost};
use super::{FetchLimits, HostResolver};

/// Sent on every fetch request.
pub const USER_AGENT: &str = "harness-webfetch/0.0";

/// The validated arguments of one fetch call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FetchArgs {
    pub url: String,
    pub max_chars: usize,
    pub raw: bool,
}

/// Checks the arguments; an error is the hard failure message.
pub(crate) fn parse_fetch_args(args: &Json, char_limit: usize) -> Result<FetchArgs, String> {
    let url = args
        .get("url")
        .and_then(Json::as_str)
        .ok_or("web_fetch: missing url argument")?;
    let max_chars = match args.get("max_chars") {
        None | Some(Json::Null) => char_limit,
        Some(value) => positive_integer(value)
            .ok_or("web_fetch: max_chars must be a positive integer")?
            .min(char_limit),
    };
    let raw = match args.get("raw") {
        None | Some(Json::Null) => false,
        Some(Json::Bool(raw)) => *raw,
        Some(_) => return Err("web_fetch: raw must be a boolean".into()),
    };
    Ok(FetchArgs {
        url: url.to_string(),
        max_chars,
        raw,
    })
}

/// An integer of at least 1; a whole float (as Lua may send) counts.
fn positive_integer(value: &Json) -> Option<usize> {
    if let Some(n) = value.as_u64() {
        return (n >= 1).then(|| usize::try_from(n).unwrap_or(usize::MAX));
    }
    let f = value.as_f64()?;
    if f >= 1.0 && f.fract() == 0.0 {
        // Saturating float-to-int conversion.
        Some(f as usize)
    } else {
        None
    }
}

/// Where a fetch stopped early: a hard failure fails the call, soft text is its result.
enum Stop {
    Hard(String),
    Soft(String),
}

impl From<Refusal> for Stop {
    fn from(refusal: Refusal) -> Self {
        if refusal.hard {
            Stop::Hard(refusal.message)
        } else {
            Stop::Soft(refusal.message)
        }
    }
}

/// Runs fetch calls under one policy.
pub(crate) struct Fetcher {
    pub limits: FetchLimits,
    pub allow_loopback: bool,
    pub resolver: Arc<dyn HostResolver>,
}

/// How reading a body ended.
enum Body {
    Complete(Vec<u8>),
    /// More than the cap arrived; holds exactly the first `cap` bytes.
    OverCap(Vec<u8>),
    Failed,
}

impl Fetcher {
    /// One fetch call: result text (soft failures included) or a hard failure.
    pub(crate) async fn fetch(&self, args: &Json) -> Result<String, ToolFailure> {
        let args = parse_fetch_args(args, self.limits.max_chars).map_err(ToolFailure)?;
        match self.run(&args).await {
            Ok(text) | Err(Stop::Soft(text)) => Ok(text),
            Err(Stop::Hard(message)) => Err(ToolFailure(message)),
        }
    }

    async fn run(&self, args: &FetchArgs) -> Result<String, Stop> {
        let mut target = policy::admit_text(&args.url, self.allow_loopback)?;
        let mut hops = 0usize;
        let mut came_from: Option<Target> = None;
        loop {
            let addresses = self.vetted_addresses(&target).await?;
            let addresses = match policy::loopback_addresses(&target, addresses) {
                Ok(addresses) => addresses,
                // On a redirect hop the broken rule is a refused redirect, as in `next_hop`.
                Err(refusal) => match &came_from {
                    Some(from) => {
                        return Err(Stop::Soft(format!(
                            "redirect from {} to {} refused: {}",
                            policy::display_url(&from.url),
                            policy::display_url(&target.url),
                            refusal.message
                        )))
                    }
                    None => return Err(refusal.into()),
                },
            };
            let client = self.client_for(&target, &addresses)?;
            let deadline = Instant::now() + self.limits.request_timeout;
            let shown = policy::display_url(&target.url);
            let response = match tokio::time::timeout_at(
                deadline,
                client.get(target.url.clone()).send(),
            )
            .await
            {
                Err(_) => return Err(timed_out(&shown)),
                Ok(Err(error)) if error.is_timeout() => return Err(timed_out(&shown)),
                Ok(Err(_)) => return Err(network_error(&target.url)),
                Ok(Ok(response)) => response,
            };
            let status = response.status();
            if matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308) {
                if let Some(location) = response.headers().get(LOCATION) {
                    let location = String::from_utf8_lossy(location.as_bytes()).into_owned();
                    let next = self.next_hop(&target, &location, hops)?;
                    came_from = Some(std::mem::replace(&mut target, next));
                    hops += 1;
                    continue;
                }
            }
            if !status.is_success() {
                return Err(Stop::Soft(format!(
                    "{shown} answered HTTP {}; try a different URL",
                    status.as_u16()
                )));
            }
            return self.read_page(response, &target, args, deadline).await;
        }
    }

    /// Checks a redirect hop: hop cap, downgrade, then the admission rules.
    fn next_hop(&self, from: &Target, location: &str, hops: usize) -> Result<Target, Stop> {
        let shown_from = policy::display_url(&from.url);
        let refused = |to: &str, reason: &str| {
            Stop::Soft(format!(
                "redirect from {shown_from} to {to} refused: {reason}"
            ))
        };
        let Ok(next) = from.url.join(location) else {
            let to = location.split(['?', '#']).next().unwrap_or("");
            return Err(refused(to, "invalid url"));
        };
        let shown_to = policy::display_url(&next);
        if hops >= self.limits.max_redirects {
            let reason = format!("exceeded max redirects ({})", self.limits.max_redirects);
            return Err(refused(&shown_to, &reason));
        }
        if from.url.scheme() == "https" && next.scheme() == "http" {
            return Err(refused(&shown_to, "refusing https to http downgrade"));
        }
        policy::admit(next, self.allow_loopback).map_err(|r| refused(&shown_to, &r.message))
    }

    /// Resolves a host name and keeps only allowed addresses, afresh on every hop.
    async fn vetted_addresses(&self, target: &Target) -> Result<Vec<IpAddr>, Stop> {
        let name = match &target.host {
            TargetHost::Address(address) => return Ok(vec![*address]),
            TargetHost::Name(name) => name,
        };
        let port = target.url.port_or_known_default().unwrap_or(443);
        let lookup = self.resolver.resolve(name, port);
        let resolved = tokio::time::timeout(self.limits.request_timeout, lookup).await;
        let addresses = match resolved {
            Ok(Ok(addresses)) => addresses,
            Ok(Err(_)) | Err(_) => {
                return Err(Stop::Soft(format!("dns resolution failed for {name}")));
            }
        };
        let allowed: Vec<IpAddr> = addresses
            .into_iter()
            .filter(|address| policy::address_allowed(*address, self.allow_loopback))
            .collect();
        if allowed.is_empty() {
            return Err(Stop::Hard(format!("host {name} has no allowed address")));
        }
        Ok(allowed)
    }

    /// A client that can reach only the vetted addresses: its own resolver
    /// refuses every name, and the target's name is pinned to `addresses`.
    fn client_for(&self, target: &Target, addresses: &[IpAddr]) -> Result<reqwest::Client, Stop> {
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .referer(false)
            .connect_timeout(self.limits.connect_timeout)
            .user_agent(USER_AGENT)
            // Bodies arrive decompressed, so the byte cap counts expanded bytes
            // and a decompression bomb stops at the cap.
            .gzip(true)
            .brotli(true)
            .deflate(true)
            .dns_resolver(Arc::new(RefuseEveryName));
        if let TargetHost::Name(name) = &target.host {
            // Port 0: reqwest uses the URL's port.
            let pinned: Vec<SocketAddr> = addresses
                .iter()
                .map(|address| SocketAddr::new(*address, 0))
                .collect();
            builder = builder.resolve_to_addrs(name, &pinned);
        }
        builder.build().map_err(|_| network_error(&target.url))
    }

    async fn read_page(
        &self,
        response: reqwest::Response,
        target: &Target,
        args: &FetchArgs,
        deadline: Instant,
    ) -> Result<String, Stop> {
        let shown = policy::display_url(&target.url);
        let Some(declared) = response.headers().get(CONTENT_TYPE) else {
            return Err(Stop::Soft(format!(
                "response from {shown} declared no content type; refusing to guess its format; try a different URL"
            )));
        };
        let declared = String::from_utf8_lossy(declared.as_bytes())
            .trim()
            .to_string();
        let Some(content_type) = extract::classify_content_type(&declared) else {
            return Err(Stop::Soft(format!(
                "content type {declared} from {shown} cannot be returned as text; try an HTML version of the page or a different URL"
            )));
        };
        let encoding = extract::decoder_for(content_type.charset.as_deref()).map_err(|label| {
            Stop::Soft(format!(
                "response from {shown} declared unknown charset {label}; cannot decode its text"
            ))
        })?;
        let cap = self.limits.body_cap;
        let over_cap = || {
            Stop::Soft(format!(
                "response from {shown} exceeds the {cap}-byte size cap"
            ))
        };
        let whole_only = content_type.kind != BodyKind::Flat;
        let declared_length = response.content_length().unwrap_or(0);
        if whole_only && usize::try_from(declared_length).map_or(true, |n| n > cap) {
            return Err(over_cap());
        }
        let (bytes, cut_at_cap) = match read_body(response, cap, deadline).await {
            Body::Complete(bytes) => (bytes, false),
            Body::OverCap(_) if whole_only => return Err(over_cap()),
            Body::OverCap(bytes) => (bytes, true),
            Body::Failed => {
                return Err(Stop::Soft(format!(
                    "the response body from {shown} could not be read; try again or use a different URL"
                )));
            }
        };
        let text = extract::decode(&bytes, encoding);
        drop(bytes);
        let (content, extraction) = if content_type.kind == BodyKind::Html {
            let raw = args.raw;
            // Parsing and rendering a large page is CPU work: keep it off the runtime threads.
            tokio::task::spawn_blocking(move || extract::html_to_markdown(&text, raw))
                .await
                .unwrap_or_else(|_| (String::new(), Extraction::RawHtml))
        } else {
            (text, Extraction::Plain)
        };
        let (content, cut_at_chars) = cut_chars(content, args.max_chars);
        Ok(format!(
            "url: {}\ntruncated: {}\nextraction: {}\n\n{}",
            target.url,
            cut_at_cap || cut_at_chars,
            extraction.label(),
            content
        ))
    }
}

/// Reads at most `cap` bytes of body (plus one chunk to notice the overflow).
async fn read_body(mut response: reqwest::Response, cap: usize, deadline: Instant) -> Body {
    let mut bytes = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Err(_) | Ok(Err(_)) => return Body::Failed,
            Ok(Ok(None)) => return Body::Complete(bytes),
            Ok(Ok(Some(chunk))) => {
                let room = cap.saturating_sub(bytes.len());
                if chunk.len() > room {
                    bytes.extend_from_slice(chunk.get(..room).unwrap_or_default());
                    return Body::OverCap(bytes);
                }
                bytes.extend_from_slice(&chunk);
            }
        }
    }
}

/// Keeps the first `max_chars` characters; reports whether it cut.
fn cut_chars(text: String, max_chars: usize) -> (String, bool) {
    match text.char_indices().nth(max_chars) {
        Some((byte_index, _)) => {
            let mut text = text;
            text.truncate(byte_index);
            (text, true)
        }
        None => (text, false),
    }
}

fn timed_out(shown: &str) -> Stop {
    Stop::Soft(format!(
        "request to {shown} timed out; try again or use a different URL"
    ))
}

fn network_error(url: &Url) -> Stop {
    Stop::Soft(format!(
        "fetch failed for {}: network error; try a different URL",
        policy::requested_url(url)
    ))
}

/// The fetch client's DNS: names reach it only when not pinned, and then it refuses.
struct RefuseEveryName;

impl reqwest::dns::Resolve for RefuseEveryName {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let message = format!("{} was not vetted for this request", name.as_str());
        Box::pin(async move { Err(message.into()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_are_checked_in_order() {
        let parse = |v: Json| parse_fetch_args(&v, 40_000);
        assert_eq!(
            parse(json!({})).err().as_deref(),
            Some("web_fetch: missing url argument")
        );
        assert_eq!(
            parse(json!({"url": 5})).err().as_deref(),
            Some("web_fetch: missing url argument")
        );
        assert_eq!(
            parse(json!("https://example.com/")).err().as_deref(),
            Some("web_fetch: missing url argument")
        );
        for bad in [json!(0), json!(-3), json!(2.5), json!("10"), json!(true)] {
            assert_eq!(
                parse(json!({"url": "u", "max_chars": bad}))
                    .err()
                    .as_deref(),
                Some("web_fetch: max_chars must be a positive integer")
            );
        }
        for bad in [json!(1), json!("true"), json!([])] {
            assert_eq!(
                parse(json!({"url": "u", "raw": bad})).err().as_deref(),
                Some("web_fetch: raw must be a boolean")
            );
        }
        assert_eq!(
            parse(json!({"url": "u", "max_chars": null, "raw": null})),
            Ok(FetchArgs {
                url: "u".into(),
                max_chars: 40_000,
                raw: false
            })
        );
        assert_eq!(
            parse(json!({"url": "u", "max_chars": 90_000, "raw": true})),
            Ok(FetchArgs {
                url: "u".into(),
                max_chars: 40_000,
                raw: true
            })
        );
        assert_eq!(
            parse(json!({"url": "u", "max_chars": 5000.0})).map(|a| a.max_chars),
            Ok(5000)
        );
    }

    #[test]
    fn cut_counts_characters_not_bytes() {
        assert_eq!(cut_chars("héllo".into(), 2), ("hé".into(), true));
        assert_eq!(cut_chars("héllo".into(), 5), ("héllo".into(), false));
        assert_eq!(cut_chars("".into(), 1), ("".into(), false));
    }
}
