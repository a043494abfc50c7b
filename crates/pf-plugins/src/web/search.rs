//! The search tool: argument validation, the three backends, and the checks
//! on what a backend answers.

use std::time::Duration;

use pf_harness::ToolFailure;
use serde_json::{json, Map, Value as Json};
use tokio::time::Instant;

use super::SearchBackend;

const INVALID: &str = "web_search: invalid arguments";

/// A successful backend answer larger than this is refused whole.
pub(crate) const RESPONSE_CAP: usize = 262_144;

/// An error body is quoted up to about this many bytes.
const ERROR_BODY_QUOTE: usize = 2000;

/// The Brave Search web endpoint, used when no `search_url` is configured.
pub(crate) const BRAVE_DEFAULT_URL: &str = "https://api.search.brave.com/res/v1/web/search";

/// The validated arguments of one search call.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct SearchArgs {
    pub query: String,
    pub count: Option<u64>,
    pub freshness: Option<String>,
    pub country: Option<String>,
    pub search_lang: Option<String>,
    pub safesearch: Option<String>,
    pub include_domains: Vec<String>,
    pub exclude_domains: Vec<String>,
    /// The accepted fields as sent (nulls dropped), in the caller's order.
    pub body: Map<String, Json>,
}

/// Checks the arguments: first shape and types (`invalid arguments`), then
/// each argument's own rule in table order.
pub(crate) fn parse_search_args(args: &Json) -> Result<SearchArgs, String> {
    let object = args.as_object().ok_or(INVALID)?;
    let mut parsed = SearchArgs::default();
    let mut query = None;
    for (key, value) in object {
        if value.is_null() {
            if key == "query" {
                return Err(INVALID.into());
            }
            continue;
        }
        match key.as_str() {
            "query" => query = Some(value.as_str().ok_or(INVALID)?.to_string()),
            "count" => parsed.count = Some(value.as_u64().ok_or(INVALID)?),
            "freshness" => {
                parsed.freshness = Some(one_of(value, &["pd", "pw", "pm", "py"])?);
            }
            "safesearch" => {
                parsed.safesearch = Some(one_of(value, &["off", "moderate", "strict"])?);
            }
            "country" => parsed.country = Some(value.as_str().ok_or(INVALID)?.to_string()),
            "search_lang" => {
                parsed.search_lang = Some(value.as_str().ok_or(INVALID)?.to_string());
            }
            "include_domains" => parsed.include_domains = string_list(value)?,
            "exclude_domains" => parsed.exclude_domains = string_list(value)?,
            _ => return Err(INVALID.into()),
        }
        parsed.body.insert(key.clone(), value.clone());
    }
    parsed.query = query.ok_or(INVALID)?;
    if parsed.query.trim().is_empty() {
        return Err("web_search: query must not be empty".into());
    }
    if parsed.query.chars().count() > 400 {
        return Err("web_search: query exceeds 400 characters".into());
    }
    if let Some(count) = parsed.count {
        if !(1..=20).contains(&count) {
            return Err("web_search: count must be between 1 and 20".into());
        }
    }
    for (field, value) in [
        ("country", &parsed.country),
        ("search_lang", &parsed.search_lang),
    ] {
        if let Some(value) = value {
            if value.trim().is_empty() || value.chars().count() > 128 {
                return Err(format!("web_search: {field} must be 1..=128 characters"));
            }
        }
    }
    for (field, list) in [
        ("include_domains", &parsed.include_domains),
        ("exclude_domains", &parsed.exclude_domains),
    ] {
        if list.len() > 20 {
            return Err(format!("web_search: {field} may list at most 20 hostnames"));
        }
        if !list.iter().all(|host| is_bare_hostname(host)) {
            return Err(format!("web_search: {field} contains an invalid hostname"));
        }
    }
    Ok(parsed)
}

fn one_of(value: &Json, allowed: &[&str]) -> Result<String, String> {
    match value.as_str() {
        Some(text) if allowed.contains(&text) => Ok(text.to_string()),
        _ => Err(INVALID.into()),
    }
}

fn string_list(value: &Json) -> Result<Vec<String>, String> {
    value
        .as_array()
        .ok_or(INVALID)?
        .iter()
        .map(|item| item.as_str().map(str::to_string).ok_or(INVALID.into()))
        .collect()
}

fn is_bare_hostname(host: &str) -> bool {
    !host.trim().is_empty()
        && host.chars().count() <= 128
        && !host
            .chars()
            .any(|c| c == '/' || c.is_whitespace() || c.is_control())
}

/// Runs search calls against one backend.
pub(crate) struct Searcher {
    pub backend: SearchBackend,
    pub url: Option<String>,
    pub key_env: Option<String>,
    pub timeout: Duration,
    pub client: reqwest::Client,
}

impl Searcher {
    pub(crate) async fn search(&self, args: &Json) -> Result<String, ToolFailure> {
        let args = parse_search_args(args).map_err(ToolFailure)?;
        let deadline = Instant::now() + self.timeout;
        let request = self.request(&args)?;
        let response = match tokio::time::timeout_at(deadline, request.send()).await {
            Ok(Ok(response)) => response,
            Ok(Err(_)) | Err(_) => return Err(failure("web_search: request failed")),
        };
        let body = read_answer(response, deadline).await?;
        match self.backend {
            SearchBackend::Gateway => {
                check_results(&body)?;
                Ok(body)
            }
            SearchBackend::Searxng => map_rows(&body, &["results"], "content", &args),
            SearchBackend::Brave => map_rows(&body, &["web", "results"], "description", &args),
        }
    }

    fn api_key(&self) -> Result<Option<String>, ToolFailure> {
        let Some(name) = &self.key_env else {
            return Ok(None);
        };
        match std::env::var(name) {
            Ok(key) if !key.is_empty() => Ok(Some(key)),
            _ => Err(failure(format!(
                "web_search: the search API key variable {name} is not set"
            ))),
        }
    }

    fn request(&self, args: &SearchArgs) -> Result<reqwest::RequestBuilder, ToolFailure> {
        let configured = self.url.as_deref();
        let no_url = || failure("web_search: no search backend URL is configured");
        let key = self.api_key()?;
        let request = match self.backend {
            SearchBackend::Gateway => {
                let mut request = self
                    .client
                    .post(configured.ok_or_else(no_url)?)
                    .json(&Json::Object(args.body.clone()));
                if let Some(key) = key {
                    request = request.bearer_auth(key);
                }
                request
            }
            SearchBackend::Searxng => {
                let mut query = vec![
                    ("q".to_string(), args.query.clone()),
                    ("format".to_string(), "json".to_string()),
                ];
                if let Some(lang) = &args.search_lang {
                    let language = match &args.country {
                        Some(country) => format!("{lang}-{country}"),
                        None => lang.clone(),
                    };
                    query.push(("language".into(), language));
                }
                if let Some(level) = &args.safesearch {
                    let level = match level.as_str() {
                        "off" => "0",
                        "moderate" => "1",
                        _ => "2",
                    };
                    query.push(("safesearch".into(), level.into()));
                }
                if let Some(freshness) = &args.freshness {
                    let range = match freshness.as_str() {
                        "pd" => "day",
                        "pw" => "week",
                        "pm" => "month",
                        _ => "year",
                    };
                    query.push(("time_range".into(), range.into()));
                }
                let mut request = self
                    .client
                    .get(configured.ok_or_else(no_url)?)
                    .query(&query);
                if let Some(key) = key {
                    request = request.bearer_auth(key);
                }
                request
            }
            SearchBackend::Brave => {
                let Some(key) = key else {
                    return Err(failure(
                        "web_search: the brave backend needs search_api_key_env",
                    ));
                };
                let mut query = vec![("q".to_string(), brave_query(args))];
                if let Some(count) = args.count {
                    query.push(("count".into(), count.to_string()));
                }
                for (name, value) in [
                    ("country", &args.country),
                    ("search_lang", &args.search_lang),
                    ("safesearch", &args.safesearch),
                    ("freshness", &args.freshness),
                ] {
                    if let Some(value) = value {
                        query.push((name.into(), value.clone()));
                    }
                }
                self.client
                    .get(configured.unwrap_or(BRAVE_DEFAULT_URL))
                    .query(&query)
                    .header("Accept", "application/json")
                    .header("X-Subscription-Token", key)
            }
        };
        Ok(request)
    }
}

/// Brave filters sites through query operators.
fn brave_query(args: &SearchArgs) -> String {
    let mut query = args.query.clone();
    match args.include_domains.as_slice() {
        [] => {}
        [one] => query.push_str(&format!(" site:{one}")),
        many => {
            let sites: Vec<String> = many.iter().map(|d| format!("site:{d}")).collect();
            query.push_str(&format!(" ({})", sites.join(" OR ")));
        }
    }
    for domain in &args.exclude_domains {
        query.push_str(&format!(" -site:{domain}"));
    }
    query
}

fn failure(message: impl Into<String>) -> ToolFailure {
    ToolFailure(message.into())
}

/// Reads a backend answer: a 2xx body within the cap as UTF-8, or the failure.
async fn read_answer(
    mut response: reqwest::Response,
    deadline: Instant,
) -> Result<String, ToolFailure> {
    let status = response.status();
    if !status.is_success() {
        let code = status.as_u16();
        let mut quoted = Vec::new();
        loop {
            match tokio::time::timeout_at(deadline, response.chunk()).await {
                Ok(Ok(Some(chunk))) => {
                    quoted.extend_from_slice(&chunk);
                    if quoted.len() > ERROR_BODY_QUOTE {
                        break;
                    }
                }
                Ok(Ok(None)) => break,
                Ok(Err(_)) | Err(_) => {
                    return Err(failure(format!(
                        "web_search: backend returned {code}, and its error body could not be read"
                    )));
                }
            }
        }
        let body = escape_error_body(&quoted);
        let body = if body.is_empty() {
            "(empty body)".to_string()
        } else {
            body
        };
        return Err(failure(format!(
            "web_search: backend returned {code}: {body}"
        )));
    }
    let mut bytes = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Ok(Ok(Some(chunk))) => {
                bytes.extend_from_slice(&chunk);
                if bytes.len() > RESPONSE_CAP {
                    return Err(failure(format!(
                        "web_search: response body exceeded {RESPONSE_CAP} bytes"
                    )));
                }
            }
            Ok(Ok(None)) => break,
            Ok(Err(_)) | Err(_) => return Err(failure("web_search: reading response failed")),
        }
    }
    String::from_utf8(bytes).map_err(|_| failure("web_search: response body was not valid UTF-8"))
}

/// Cuts to about [`ERROR_BODY_QUOTE`] bytes and escapes control characters so
/// the message stays on one line.
fn escape_error_body(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut end = text.len().min(ERROR_BODY_QUOTE);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::new();
    for c in text.get(..end).unwrap_or_default().chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:04x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

const MALFORMED: &str = "web_search: malformed search response";

/// The gateway answer's shape: a `results` array whose rows carry a non-blank string `url`.
fn check_results(body: &str) -> Result<(), ToolFailure> {
    let value: Json = serde_json::from_str(body).map_err(|_| failure(MALFORMED))?;
    let rows = value
        .get("results")
        .and_then(Json::as_array)
        .ok_or_else(|| failure(MALFORMED))?;
    for (index, row) in rows.iter().enumerate() {
        let url = row
            .get("url")
            .and_then(Json::as_str)
            .ok_or_else(|| failure(MALFORMED))?;
        if url.trim().is_empty() {
            return Err(failure(format!(
                "{MALFORMED}: result {index} has an empty url"
            )));
        }
    }
    Ok(())
}

/// Maps a searxng or Brave answer to `{"results":[{"title","url","description"}]}`,
/// applying the domain filters and `count` the service may not honour itself.
fn map_rows(
    body: &str,
    rows_at: &[&str],
    description_field: &str,
    args: &SearchArgs,
) -> Result<String, ToolFailure> {
    let value: Json = serde_json::from_str(body).map_err(|_| failure(MALFORMED))?;
    if !value.is_object() {
        return Err(failure(MALFORMED));
    }
    let mut rows = Some(&value);
    for key in rows_at {
        rows = rows.and_then(|v| v.get(*key));
    }
    let rows = match rows {
        // Brave leaves out `web` when nothing matched.
        None => &Vec::new(),
        Some(rows) => rows.as_array().ok_or_else(|| failure(MALFORMED))?,
    };
    let text = |row: &Json, key: &str| {
        row.get(key)
            .and_then(Json::as_str)
            .unwrap_or("")
            .to_string()
    };
    let mut results = Vec::new();
    for row in rows {
        let url = text(row, "url");
        if url.trim().is_empty() || !domain_wanted(&url, args) {
            continue;
        }
        results.push(json!({
            "title": text(row, "title"),
            "url": url,
            "description": text(row, description_field),
        }));
    }
    if let Some(count) = args.count {
        results.truncate(usize::try_from(count).unwrap_or(usize::MAX));
    }
    Ok(json!({ "results": results }).to_string())
}

fn domain_wanted(url: &str, args: &SearchArgs) -> bool {
    let host = url::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_ascii_lowercase))
        .unwrap_or_default();
    let matches = |domain: &String| {
        let domain = domain.trim().trim_end_matches('.').to_ascii_lowercase();
        host == domain || host.ends_with(&format!(".{domain}"))
    };
    (args.include_domains.is_empty() || args.include_domains.iter().any(matches))
        && !args.exclude_domains.iter().any(matches)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(args: Json) -> String {
        match parse_search_args(&args) {
            Ok(parsed) => panic!("accepted {parsed:?}"),
            Err(message) => message,
        }
    }

    #[test]
    fn shape_and_type_errors_are_invalid_arguments() {
        for args in [
            json!("rust"),
            json!({}),
            json!({"query": null}),
            json!({"query": 5}),
            json!({"query": "q", "extra": 1}),
            json!({"query": "q", "count": -1}),
            json!({"query": "q", "count": 2.5}),
            json!({"query": "q", "count": "5"}),
            json!({"query": "q", "freshness": "pz"}),
            json!({"query": "q", "safesearch": "high"}),
            json!({"query": "q", "country": 1}),
            json!({"query": "q", "include_domains": "example.com"}),
            json!({"query": "q", "exclude_domains": [1]}),
        ] {
            assert_eq!(error(args.clone()), INVALID, "{args}");
        }
    }

    #[test]
    fn each_rule_has_its_own_message() {
        assert_eq!(
            error(json!({"query": "  \n"})),
            "web_search: query must not be empty"
        );
        assert_eq!(
            error(json!({"query": ""})),
            "web_search: query must not be empty"
        );
        assert_eq!(
            error(json!({"query": "é".repeat(401)})),
            "web_search: query exceeds 400 characters"
        );
        assert_eq!(
            error(json!({"query": "q", "count": 0})),
            "web_search: count must be between 1 and 20"
        );
        assert_eq!(
            error(json!({"query": "q", "count": 21})),
            "web_search: count must be between 1 and 20"
        );
        assert_eq!(
            error(json!({"query": "q", "country": " "})),
            "web_search: country must be 1..=128 characters"
        );
        assert_eq!(
            error(json!({"query": "q", "search_lang": "x".repeat(129)})),
            "web_search: search_lang must be 1..=128 characters"
        );
        let many: Vec<String> = (0..21).map(|i| format!("h{i}.example")).collect();
        assert_eq!(
            error(json!({"query": "q", "include_domains": many})),
            "web_search: include_domains may list at most 20 hostnames"
        );
        assert_eq!(
            error(json!({"query": "q", "exclude_domains": many})),
            "web_search: exclude_domains may list at most 20 hostnames"
        );
        for bad in [
            "",
            " ",
            "example.com/path",
            "a b",
            "bad\u{7}",
            &"x".repeat(129),
        ] {
            assert_eq!(
                error(json!({"query": "q", "include_domains": [bad]})),
                "web_search: include_domains contains an invalid hostname"
            );
        }
        assert_eq!(
            error(json!({"query": "q", "exclude_domains": ["ok.example", "a/b"]})),
            "web_search: exclude_domains contains an invalid hostname"
        );
    }

    #[test]
    fn accepted_arguments_keep_their_order_and_drop_nulls() {
        let parsed = parse_search_args(&json!({
            "query": "é".repeat(400), "count": 20, "freshness": "pw", "safesearch": "strict",
            "country": "x".repeat(128), "search_lang": null, "include_domains": ["example.com"]
        }))
        .expect("valid");
        assert_eq!(parsed.count, Some(20));
        let keys: Vec<&String> = parsed.body.keys().collect();
        assert_eq!(
            keys,
            [
                "query",
                "count",
                "freshness",
                "safesearch",
                "country",
                "include_domains"
            ]
        );
    }

    #[test]
    fn error_bodies_are_cut_and_escaped() {
        assert_eq!(
            escape_error_body(b"line1\nline2\r\tend\x1b[31m"),
            "line1\\nline2\\r\\tend\\u{001b}[31m"
        );
        let long = "é".repeat(3000);
        let quoted = escape_error_body(long.as_bytes());
        assert_eq!(quoted.len(), 2000);
    }

    #[test]
    fn gateway_shape_checks() {
        assert!(check_results(r#"{"results":[]}"#).is_ok());
        assert!(check_results(r#"{"results":[{"url":"https://e.com","x":1}]}"#).is_ok());
        for bad in [
            "not json",
            "{}",
            r#"{"results":{}}"#,
            r#"{"results":[{"title":"t"}]}"#,
            r#"{"results":[{"url":5}]}"#,
        ] {
            assert_eq!(
                check_results(bad),
                Err(ToolFailure(MALFORMED.into())),
                "{bad}"
            );
        }
        assert_eq!(
            check_results(r#"{"results":[{"url":"https://e.com"},{"url":"  "}]}"#),
            Err(ToolFailure(
                "web_search: malformed search response: result 1 has an empty url".into()
            ))
        );
    }

    #[test]
    fn domain_filters_match_hosts_and_subdomains() {
        let args = SearchArgs {
            include_domains: vec!["example.com".into()],
            exclude_domains: vec!["bad.example.com".into()],
            ..SearchArgs::default()
        };
        assert!(domain_wanted("https://example.com/a", &args));
        assert!(domain_wanted("https://www.example.com/a", &args));
        assert!(!domain_wanted("https://bad.example.com/a", &args));
        assert!(!domain_wanted("https://notexample.com/a", &args));
    }
}
