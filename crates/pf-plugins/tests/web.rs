//! The web Plugin against a local HTTP server on 127.0.0.1; no traffic goes
//! anywhere else (refused addresses are refused before any connection).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pf_harness::{
    ActivationContext, ActivePlugin, CancellationToken, HostServices, Plugin, ToolFailure,
};
use pf_plugins::{FetchLimits, HostResolver, SearchBackend, WebConfig, WebPlugin};
use serde_json::{json, Value as Json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// ---------------------------------------------------------------------------
// A local HTTP server
// ---------------------------------------------------------------------------

#[derive(Clone, Default)]
struct Page {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Declare this Content-Length but send only `body`, then close.
    declared_length: Option<usize>,
    /// Wait this long before answering.
    delay: Option<Duration>,
    /// Send no Content-Length: the body ends when the connection closes.
    no_length: bool,
    /// After the body, keep the connection open without sending more.
    hold_open: bool,
}

fn page(status: u16, content_type: Option<&str>, body: impl Into<Vec<u8>>) -> Page {
    let mut headers = Vec::new();
    if let Some(content_type) = content_type {
        headers.push(("Content-Type".to_string(), content_type.to_string()));
    }
    Page {
        status,
        headers,
        body: body.into(),
        ..Page::default()
    }
}

fn redirect(location: &str) -> Page {
    Page {
        status: 302,
        headers: vec![("Location".into(), location.into())],
        ..Page::default()
    }
}

#[derive(Debug, Clone)]
struct Seen {
    method: String,
    target: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

struct TestServer {
    base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    async fn start(pages: Vec<(&str, Page)>) -> TestServer {
        let pages: Arc<HashMap<String, Page>> = Arc::new(
            pages
                .into_iter()
                .map(|(p, page)| (p.to_string(), page))
                .collect(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(serve(socket, pages.clone(), recorded.clone()));
            }
        });
        TestServer { base, seen, task }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }
}

async fn serve(
    mut socket: tokio::net::TcpStream,
    pages: Arc<HashMap<String, Page>>,
    seen: Arc<Mutex<Vec<Seen>>>,
) {
    let mut data = Vec::new();
    let mut buffer = [0u8; 8192];
    let head_end = loop {
        let n = socket.read(&mut buffer).await.unwrap_or(0);
        if n == 0 {
            return;
        }
        data.extend_from_slice(&buffer[..n]);
        if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&data[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or("");
    let mut parts = request_line.split(' ');
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while data.len() < head_end + length {
        let n = socket.read(&mut buffer).await.unwrap_or(0);
        if n == 0 {
            break;
        }
        data.extend_from_slice(&buffer[..n]);
    }
    let body = data.get(head_end..).unwrap_or_default().to_vec();
    seen.lock().expect("lock").push(Seen {
        method,
        target: target.clone(),
        headers,
        body,
    });
    let path = target.split('?').next().unwrap_or("").to_string();
    let page = pages
        .get(&path)
        .cloned()
        .unwrap_or_else(|| page(404, Some("text/plain"), "not found"));
    if let Some(delay) = page.delay {
        tokio::time::sleep(delay).await;
    }
    let mut response = format!("HTTP/1.1 {} X\r\nConnection: close\r\n", page.status);
    for (name, value) in &page.headers {
        response.push_str(&format!("{name}: {value}\r\n"));
    }
    if !page.no_length {
        response.push_str(&format!(
            "Content-Length: {}\r\n",
            page.declared_length.unwrap_or(page.body.len())
        ));
    }
    response.push_str("\r\n");
    let _ = socket.write_all(response.as_bytes()).await;
    let _ = socket.write_all(&page.body).await;
    if page.hold_open {
        let _ = socket.flush().await;
        tokio::time::sleep(Duration::from_secs(600)).await;
    }
    let _ = socket.shutdown().await;
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// A resolver with a fixed table; names not in it fail to resolve.
struct TableResolver(HashMap<String, Vec<IpAddr>>);

#[async_trait]
impl HostResolver for TableResolver {
    async fn resolve(&self, host: &str, _port: u16) -> std::io::Result<Vec<IpAddr>> {
        self.0
            .get(host)
            .cloned()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such host"))
    }
}

fn table(entries: &[(&str, &[&str])]) -> Arc<TableResolver> {
    Arc::new(TableResolver(
        entries
            .iter()
            .map(|(name, addresses)| {
                (
                    name.to_string(),
                    addresses
                        .iter()
                        .map(|a| a.parse().expect("address"))
                        .collect(),
                )
            })
            .collect(),
    ))
}

fn context() -> ActivationContext {
    ActivationContext {
        store_dir: std::env::temp_dir(),
        cancel: CancellationToken::new(),
        services: HostServices::default(),
        config: None,
    }
}

fn loopback_config() -> WebConfig {
    WebConfig {
        allow_loopback: true,
        ..WebConfig::default()
    }
}

async fn active(plugin: WebPlugin) -> Arc<dyn ActivePlugin> {
    match plugin.activate(context()).await {
        Ok(active) => active,
        Err(error) => panic!("activation failed: {error}"),
    }
}

async fn fetch(web: &Arc<dyn ActivePlugin>, arguments: Json) -> Result<String, ToolFailure> {
    web.call(
        "promptforge/web/fetch",
        arguments,
        &pf_harness::WorkId::new("0", 0),
        CancellationToken::new(),
    )
    .await
}

async fn search(web: &Arc<dyn ActivePlugin>, arguments: Json) -> Result<String, ToolFailure> {
    web.call(
        "promptforge/web/search",
        arguments,
        &pf_harness::WorkId::new("0", 0),
        CancellationToken::new(),
    )
    .await
}

fn soft(text: &str) -> Result<String, ToolFailure> {
    Ok(text.to_string())
}

fn hard(text: &str) -> Result<String, ToolFailure> {
    Err(ToolFailure(text.to_string()))
}

// ---------------------------------------------------------------------------
// Catalog
// ---------------------------------------------------------------------------

#[tokio::test]
async fn the_plugin_offers_fetch_then_search_untrusted_and_unstructured() {
    let plugin = WebPlugin::new(WebConfig::default());
    assert_eq!(plugin.id(), "promptforge/web");
    let web = active(plugin).await;
    let tools = web.tools();
    let paths: Vec<&str> = tools.iter().map(|t| t.path.as_str()).collect();
    assert_eq!(paths, ["promptforge/web/fetch", "promptforge/web/search"]);
    assert_eq!(
        tools[0].description,
        "Fetch a web page and return its main content as markdown."
    );
    assert_eq!(
        tools[1].description,
        "Search the web and return a list of results (title, url, description)."
    );
    for tool in &tools {
        assert!(!tool.trusted);
        assert!(!tool.structured);
        assert_eq!(tool.parameters["type"], "object");
    }
    assert_eq!(tools[0].parameters["required"], json!(["url"]));
    assert_eq!(
        tools[0].parameters["properties"]["max_chars"]["maximum"],
        40_000
    );
    assert_eq!(tools[0].parameters["properties"]["raw"]["type"], "boolean");
    let search_fields: Vec<&String> = tools[1].parameters["properties"]
        .as_object()
        .expect("properties")
        .keys()
        .collect();
    assert_eq!(
        search_fields,
        [
            "query",
            "count",
            "freshness",
            "country",
            "search_lang",
            "safesearch",
            "include_domains",
            "exclude_domains"
        ]
    );
    assert_eq!(tools[1].parameters["required"], json!(["query"]));
}

// ---------------------------------------------------------------------------
// Fetch: what comes back
// ---------------------------------------------------------------------------

const ARTICLE: &str = "<html><head><title>Tides</title></head><body>\
    <nav><a href=\"/\">Home</a> <a href=\"/about\">About this site</a></nav>\
    <article><h1>Tide pools</h1>\
    <p>Tide pools are rocky pools on the seashore, cut off from the sea at low tide.</p>\
    <p>Anemones, starfish and crabs live in them.</p></article>\
    <footer>Copyright notice</footer></body></html>";

#[tokio::test]
async fn plain_text_comes_back_verbatim_under_the_header() {
    let server = TestServer::start(vec![(
        "/page.txt",
        page(
            200,
            Some("text/plain; charset=utf-8"),
            "Fixture page text for the tools chapter.",
        ),
    )])
    .await;
    let web = active(WebPlugin::new(loopback_config())).await;
    let url = server.url("/page.txt");
    assert_eq!(
        fetch(&web, json!({"url": url})).await,
        soft(&format!(
            "url: {url}\ntruncated: false\nextraction: plain\n\nFixture page text for the tools chapter."
        ))
    );
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "GET");
    assert_eq!(
        seen[0].headers.get("user-agent").map(String::as_str),
        Some("harness-webfetch/0.0")
    );
    assert!(!seen[0].headers.contains_key("authorization"));
    assert!(!seen[0].headers.contains_key("cookie"));
    assert!(!seen[0].headers.contains_key("referer"));
}

#[tokio::test]
async fn html_is_extracted_to_markdown_or_rendered_whole() {
    let server = TestServer::start(vec![
        (
            "/article",
            page(200, Some("text/html; charset=utf-8"), ARTICLE),
        ),
        ("/xhtml", page(200, Some("application/xhtml+xml"), ARTICLE)),
    ])
    .await;
    let web = active(WebPlugin::new(loopback_config())).await;
    let url = server.url("/article");
    let text = fetch(&web, json!({"url": url})).await.expect("fetched");
    let expected_header =
        format!("url: {url}\ntruncated: false\nextraction: readability\n\n# Tide pools\n");
    assert!(text.starts_with(&expected_header), "{text}");
    assert!(text.contains("Anemones, starfish and crabs live in them."));
    assert!(!text.contains("About this site"), "{text}");
    assert!(!text.contains("Copyright notice"), "{text}");

    let text = fetch(&web, json!({"url": url, "raw": true}))
        .await
        .expect("fetched");
    assert!(
        text.starts_with(&format!(
            "url: {url}\ntruncated: false\nextraction: raw-html\n\n"
        )),
        "{text}"
    );
    assert!(text.contains("About this site"));
    assert!(text.contains("Copyright notice"));

    let text = fetch(&web, json!({"url": server.url("/xhtml")}))
        .await
        .expect("fetched");
    assert!(text.contains("extraction: readability\n"), "{text}");
}

#[tokio::test]
async fn json_comes_back_exactly_and_raw_changes_nothing() {
    let body = "{\"key\":\"value\",\"numbers\":[1,2,3],\"nested\":{\"ok\":true}}";
    let server = TestServer::start(vec![(
        "/data.json",
        page(200, Some("application/json"), body),
    )])
    .await;
    let web = active(WebPlugin::new(loopback_config())).await;
    let url = server.url("/data.json");
    let expected = format!("url: {url}\ntruncated: false\nextraction: plain\n\n{body}");
    assert_eq!(fetch(&web, json!({"url": url})).await, Ok(expected.clone()));
    assert_eq!(
        fetch(&web, json!({"url": url, "raw": true})).await,
        Ok(expected)
    );
}

#[tokio::test]
async fn declared_charsets_decode_and_unknown_ones_are_refused() {
    let server = TestServer::start(vec![
        (
            "/latin1",
            page(
                200,
                Some("text/plain; charset=ISO-8859-1"),
                b"caf\xe9 cr\xe8me".to_vec(),
            ),
        ),
        (
            "/unknown",
            page(200, Some("text/plain; charset=not-a-charset"), "x"),
        ),
    ])
    .await;
    let web = active(WebPlugin::new(loopback_config())).await;
    let text = fetch(&web, json!({"url": server.url("/latin1")}))
        .await
        .expect("fetched");
    assert!(text.ends_with("\n\ncafé crème"), "{text}");
    assert_eq!(
        fetch(&web, json!({"url": server.url("/unknown?secret=1")})).await,
        soft(&format!(
            "response from {} declared unknown charset not-a-charset; cannot decode its text",
            server.url("/unknown")
        ))
    );
}

#[tokio::test]
async fn max_chars_cuts_on_characters_and_sets_truncated() {
    let server = TestServer::start(vec![(
        "/long.txt",
        page(200, Some("text/plain"), "héllo wörld"),
    )])
    .await;
    let web = active(WebPlugin::new(loopback_config())).await;
    let url = server.url("/long.txt");
    assert_eq!(
        fetch(&web, json!({"url": url, "max_chars": 4})).await,
        soft(&format!(
            "url: {url}\ntruncated: true\nextraction: plain\n\nhéll"
        ))
    );
    assert_eq!(
        fetch(&web, json!({"url": url, "max_chars": 11})).await,
        soft(&format!(
            "url: {url}\ntruncated: false\nextraction: plain\n\nhéllo wörld"
        ))
    );
}

#[tokio::test]
async fn refused_content_types_are_soft_text() {
    let server = TestServer::start(vec![
        (
            "/report.pdf",
            page(200, Some("application/pdf"), "%PDF-1.4"),
        ),
        ("/image.svg", page(200, Some("image/svg+xml"), "<svg/>")),
        ("/feed", page(200, None, "guess me")),
        ("/odd", page(200, Some("not a type"), "x")),
    ])
    .await;
    let web = active(WebPlugin::new(loopback_config())).await;
    for (path, content_type) in [
        ("/report.pdf", "application/pdf"),
        ("/image.svg", "image/svg+xml"),
        ("/odd", "not a type"),
    ] {
        assert_eq!(
            fetch(&web, json!({"url": server.url(path)})).await,
            soft(&format!(
                "content type {content_type} from {} cannot be returned as text; try an HTML version of the page or a different URL",
                server.url(path)
            ))
        );
    }
    assert_eq!(
        fetch(&web, json!({"url": server.url("/feed#frag")})).await,
        soft(&format!(
            "response from {} declared no content type; refusing to guess its format; try a different URL",
            server.url("/feed")
        ))
    );
}

#[tokio::test]
async fn error_statuses_name_the_final_url_without_its_query() {
    let server = TestServer::start(vec![("/moved", redirect("/missing?x=1"))]).await;
    let web = active(WebPlugin::new(loopback_config())).await;
    assert_eq!(
        fetch(&web, json!({"url": server.url("/missing?token=secret")})).await,
        soft(&format!(
            "{} answered HTTP 404; try a different URL",
            server.url("/missing")
        ))
    );
    assert_eq!(
        fetch(&web, json!({"url": server.url("/moved")})).await,
        soft(&format!(
            "{} answered HTTP 404; try a different URL",
            server.url("/missing")
        ))
    );
}

// ---------------------------------------------------------------------------
// Fetch: size caps, broken bodies, time limits, network errors
// ---------------------------------------------------------------------------

#[tokio::test]
async fn structured_bodies_over_the_cap_are_refused_and_flat_text_is_cut() {
    let cap = 8 * 1024 * 1024;
    let big_html = format!("<html><body><p>{}</p></body></html>", "a".repeat(cap));
    let exact_text = "b".repeat(cap);
    let over_text = "c".repeat(cap + 10);
    let over_json = format!("\"{}\"", "d".repeat(cap));
    let mut streamed_json = page(200, Some("application/json"), over_json.clone());
    // No usable Content-Length: the cap must be enforced while reading.
    streamed_json.declared_length = Some(over_json.len());
    let server = TestServer::start(vec![
        ("/big.html", page(200, Some("text/html"), big_html)),
        ("/exact.txt", page(200, Some("text/plain"), exact_text)),
        ("/big.txt", page(200, Some("text/plain"), over_text)),
        ("/big.json", streamed_json),
    ])
    .await;
    let limits = FetchLimits {
        max_chars: usize::MAX,
        ..FetchLimits::default()
    };
    let web = active(WebPlugin::new(loopback_config()).with_limits(limits)).await;
    assert_eq!(
        fetch(&web, json!({"url": server.url("/big.html")})).await,
        soft(&format!(
            "response from {} exceeds the 8388608-byte size cap",
            server.url("/big.html")
        ))
    );
    assert_eq!(
        fetch(&web, json!({"url": server.url("/big.json")})).await,
        soft(&format!(
            "response from {} exceeds the 8388608-byte size cap",
            server.url("/big.json")
        ))
    );
    let exact = fetch(&web, json!({"url": server.url("/exact.txt")}))
        .await
        .expect("fetched");
    assert!(exact.starts_with(&format!(
        "url: {}\ntruncated: false\n",
        server.url("/exact.txt")
    )));
    assert!(exact.ends_with(&format!("\n\n{}", "b".repeat(cap))));
    let cut = fetch(&web, json!({"url": server.url("/big.txt")}))
        .await
        .expect("fetched");
    assert!(cut.starts_with(&format!(
        "url: {}\ntruncated: true\n",
        server.url("/big.txt")
    )));
    assert!(cut.ends_with(&format!("\n\n{}", "c".repeat(cap))));
}

#[tokio::test]
async fn the_cap_is_enforced_while_streaming_when_no_length_is_declared() {
    let mut json_stream = page(
        200,
        Some("application/json"),
        format!("\"{}\"", "x".repeat(5000)),
    );
    json_stream.no_length = true;
    let mut text_stream = page(200, Some("text/plain"), "y".repeat(5000));
    text_stream.no_length = true;
    let mut exact_stream = page(
        200,
        Some("application/json"),
        format!("\"{}\"", "z".repeat(998)),
    );
    exact_stream.no_length = true;
    let server = TestServer::start(vec![
        ("/stream.json", json_stream),
        ("/stream.txt", text_stream),
        ("/exact.json", exact_stream),
    ])
    .await;
    let limits = FetchLimits {
        body_cap: 1000,
        ..FetchLimits::default()
    };
    let web = active(WebPlugin::new(loopback_config()).with_limits(limits)).await;
    assert_eq!(
        fetch(&web, json!({"url": server.url("/stream.json")})).await,
        soft(&format!(
            "response from {} exceeds the 1000-byte size cap",
            server.url("/stream.json")
        ))
    );
    assert_eq!(
        fetch(&web, json!({"url": server.url("/stream.txt")})).await,
        soft(&format!(
            "url: {}\ntruncated: true\nextraction: plain\n\n{}",
            server.url("/stream.txt"),
            "y".repeat(1000)
        ))
    );
    let exact = fetch(&web, json!({"url": server.url("/exact.json")}))
        .await
        .expect("fetched");
    assert!(exact.starts_with(&format!(
        "url: {}\ntruncated: false\n",
        server.url("/exact.json")
    )));
}

#[tokio::test]
async fn a_body_that_breaks_off_is_never_partial_text() {
    let mut broken = page(200, Some("text/plain"), "only part of it");
    broken.declared_length = Some(10_000);
    let server = TestServer::start(vec![("/broken.txt", broken)]).await;
    let web = active(WebPlugin::new(loopback_config())).await;
    assert_eq!(
        fetch(&web, json!({"url": server.url("/broken.txt?q=1")})).await,
        soft(&format!(
            "the response body from {} could not be read; try again or use a different URL",
            server.url("/broken.txt")
        ))
    );
}

#[tokio::test]
async fn a_slow_server_times_out_as_soft_text() {
    let mut slow = page(200, Some("text/plain"), "late");
    slow.delay = Some(Duration::from_secs(3));
    let server = TestServer::start(vec![("/slow", slow)]).await;
    let limits = FetchLimits {
        request_timeout: Duration::from_millis(300),
        ..FetchLimits::default()
    };
    let web = active(WebPlugin::new(loopback_config()).with_limits(limits)).await;
    assert_eq!(
        fetch(&web, json!({"url": server.url("/slow")})).await,
        soft(&format!(
            "request to {} timed out; try again or use a different URL",
            server.url("/slow")
        ))
    );
}

#[tokio::test]
async fn a_refused_connection_is_a_network_error_with_the_url_as_requested() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    drop(listener);
    let web = active(WebPlugin::new(loopback_config())).await;
    let url = format!("http://{address}/x?q=1#frag");
    assert_eq!(
        fetch(&web, json!({"url": url})).await,
        soft(&format!(
            "fetch failed for http://{address}/x?q=1: network error; try a different URL"
        ))
    );
}

// ---------------------------------------------------------------------------
// Fetch: redirects
// ---------------------------------------------------------------------------

#[tokio::test]
async fn redirects_are_followed_and_the_header_names_the_final_url() {
    let server = TestServer::start(vec![
        ("/start", redirect("/middle?step=2")),
        ("/middle", redirect("/page.txt?final=1#frag")),
        ("/page.txt", page(200, Some("text/plain"), "arrived")),
    ])
    .await;
    let web = active(WebPlugin::new(loopback_config())).await;
    assert_eq!(
        fetch(&web, json!({"url": server.url("/start?first=secret")})).await,
        soft(&format!(
            "url: {}\ntruncated: false\nextraction: plain\n\narrived",
            server.url("/page.txt?final=1")
        ))
    );
    let targets: Vec<String> = server.seen().into_iter().map(|s| s.target).collect();
    assert_eq!(
        targets,
        ["/start?first=secret", "/middle?step=2", "/page.txt?final=1"]
    );
}

#[tokio::test]
async fn a_redirect_to_a_refused_address_is_refused_before_contact() {
    let server = TestServer::start(vec![
        ("/to-private", redirect("https://10.0.0.1/admin?k=v")),
        (
            "/to-metadata",
            redirect("https://169.254.169.254/latest/meta-data/"),
        ),
        (
            "/to-credentials",
            redirect("http://user:pw@127.0.0.1:9/next?x=1"),
        ),
        ("/to-ftp", redirect("ftp://127.0.0.1/file")),
    ])
    .await;
    let web = active(WebPlugin::new(loopback_config())).await;
    let from = |p: &str| server.url(p);
    assert_eq!(
        fetch(&web, json!({"url": from("/to-private")})).await,
        soft(&format!(
            "redirect from {} to https://10.0.0.1/admin refused: ip literal host not allowed: 10.0.0.1",
            from("/to-private")
        ))
    );
    assert_eq!(
        fetch(&web, json!({"url": from("/to-metadata")})).await,
        soft(&format!(
            "redirect from {} to https://169.254.169.254/latest/meta-data/ refused: ip literal host not allowed: 169.254.169.254",
            from("/to-metadata")
        ))
    );
    assert_eq!(
        fetch(&web, json!({"url": from("/to-credentials")})).await,
        soft(&format!(
            "redirect from {} to http://127.0.0.1:9/next refused: url must not contain userinfo",
            from("/to-credentials")
        ))
    );
    assert_eq!(
        fetch(&web, json!({"url": from("/to-ftp")})).await,
        soft(&format!(
            "redirect from {} to ftp://127.0.0.1/file refused: scheme not allowed: ftp",
            from("/to-ftp")
        ))
    );
}

#[tokio::test]
async fn more_than_five_redirects_are_refused() {
    let server = TestServer::start(vec![
        ("/r0", redirect("/r1")),
        ("/r1", redirect("/r2")),
        ("/r2", redirect("/r3")),
        ("/r3", redirect("/r4")),
        ("/r4", redirect("/r5")),
        ("/r5", redirect("/r6")),
        ("/r6", page(200, Some("text/plain"), "too far")),
    ])
    .await;
    let web = active(WebPlugin::new(loopback_config())).await;
    assert_eq!(
        fetch(&web, json!({"url": server.url("/r0")})).await,
        soft(&format!(
            "redirect from {} to {} refused: exceeded max redirects (5)",
            server.url("/r5"),
            server.url("/r6")
        ))
    );
    let text = fetch(&web, json!({"url": server.url("/r1")}))
        .await
        .expect("fetched");
    assert!(text.ends_with("\n\ntoo far"), "{text}");
}

#[tokio::test]
async fn a_redirect_to_a_name_resolving_internally_fails_the_call() {
    let server =
        TestServer::start(vec![("/hop", redirect("http://internal.example/secret"))]).await;
    let resolver = table(&[("internal.example", &["10.0.0.5", "192.168.1.1"])]);
    let web = active(WebPlugin::new(loopback_config()).with_resolver(resolver)).await;
    assert_eq!(
        fetch(&web, json!({"url": server.url("/hop")})).await,
        hard("host internal.example has no allowed address")
    );
}

// ---------------------------------------------------------------------------
// Fetch: the policy without allow_loopback (no traffic leaves the test)
// ---------------------------------------------------------------------------

#[tokio::test]
async fn internal_targets_are_refused_without_allow_loopback() {
    let server =
        TestServer::start(vec![("/page.txt", page(200, Some("text/plain"), "secret"))]).await;
    let web = active(WebPlugin::new(WebConfig::default())).await;
    assert_eq!(
        fetch(&web, json!({"url": server.url("/page.txt")})).await,
        soft("scheme not allowed: http")
    );
    for (url, message) in [
        (
            "https://127.0.0.1/",
            "ip literal host not allowed: 127.0.0.1",
        ),
        ("https://10.0.0.1/", "ip literal host not allowed: 10.0.0.1"),
        (
            "https://169.254.169.254/latest/meta-data/",
            "ip literal host not allowed: 169.254.169.254",
        ),
        ("https://[::1]/", "ip literal host not allowed: ::1"),
        (
            "https://0177.0.0.1/",
            "ip literal host not allowed: 127.0.0.1",
        ),
        (
            "https://2130706433/",
            "ip literal host not allowed: 127.0.0.1",
        ),
        (
            "https://localhost/",
            "host localhost has no allowed address",
        ),
        (
            "https://user:pass@example.com/",
            "url must not contain userinfo",
        ),
        ("https://example.com:8080/", "port not allowed: 8080"),
        ("not a url", "invalid url"),
    ] {
        assert_eq!(
            fetch(&web, json!({"url": url})).await,
            hard(message),
            "{url}"
        );
    }
    assert!(server.seen().is_empty());
}

#[tokio::test]
async fn resolved_addresses_are_vetted_and_only_allowed_ones_are_used() {
    let server = TestServer::start(vec![(
        "/page.txt",
        page(200, Some("text/plain"), "reached"),
    )])
    .await;
    let port = server.base.rsplit(':').next().unwrap_or("").to_string();
    let resolver = table(&[
        ("internal.example", &["10.0.0.5", "127.0.0.1"]),
        (
            "mixed.example",
            &["10.0.0.5", "169.254.169.254", "127.0.0.1"],
        ),
        ("empty.example", &[]),
    ]);
    let strict = active(WebPlugin::new(WebConfig::default()).with_resolver(resolver.clone())).await;
    assert_eq!(
        fetch(&strict, json!({"url": "https://internal.example/"})).await,
        hard("host internal.example has no allowed address")
    );
    assert_eq!(
        fetch(&strict, json!({"url": "https://empty.example/"})).await,
        hard("host empty.example has no allowed address")
    );
    assert_eq!(
        fetch(&strict, json!({"url": "https://nowhere.example/"})).await,
        soft("dns resolution failed for nowhere.example")
    );
    // With loopback open, a name with a mix keeps only its allowed address.
    let open = active(WebPlugin::new(loopback_config()).with_resolver(resolver)).await;
    let url = format!("http://mixed.example:{port}/page.txt");
    assert_eq!(
        fetch(&open, json!({"url": url})).await,
        soft(&format!(
            "url: {url}\ntruncated: false\nextraction: plain\n\nreached"
        ))
    );
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn fetch_argument_errors_fail_the_call() {
    let web = active(WebPlugin::new(loopback_config())).await;
    assert_eq!(
        fetch(&web, json!({})).await,
        hard("web_fetch: missing url argument")
    );
    assert_eq!(
        fetch(&web, json!({"url": "https://example.com/", "max_chars": 0})).await,
        hard("web_fetch: max_chars must be a positive integer")
    );
    assert_eq!(
        fetch(&web, json!({"url": "https://example.com/", "raw": "yes"})).await,
        hard("web_fetch: raw must be a boolean")
    );
}

#[tokio::test]
async fn a_cancelled_fetch_returns_promptly() {
    let mut slow = page(200, Some("text/plain"), "late");
    slow.delay = Some(Duration::from_secs(5));
    let server = TestServer::start(vec![("/slow", slow)]).await;
    let web = active(WebPlugin::new(loopback_config())).await;
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        trigger.cancel();
    });
    // Uncancelled, the page arrives after its delay and the fetch succeeds:
    // the outcome itself proves the cancel.
    let outcome = web
        .call(
            "promptforge/web/fetch",
            json!({"url": server.url("/slow")}),
            &pf_harness::WorkId::new("0", 0),
            cancel,
        )
        .await;
    assert_eq!(outcome, hard("web_fetch: cancelled"));
}

// ---------------------------------------------------------------------------
// Search
// ---------------------------------------------------------------------------

fn search_page(status: u16, body: impl Into<Vec<u8>>) -> Page {
    page(status, Some("application/json"), body)
}

fn searching(backend: SearchBackend, url: String, key_env: Option<&str>) -> WebPlugin {
    WebPlugin::new(WebConfig {
        search: backend,
        search_url: Some(url),
        search_api_key_env: key_env.map(str::to_string),
        allow_loopback: true,
    })
}

const RESULTS: &str =
    "{\"results\": [{\"title\": \"T\", \"url\": \"https://e.com\", \"description\": \"D\", \"extra\": 1}]}";

#[tokio::test]
async fn gateway_gets_the_validated_arguments_and_its_answer_comes_back_unchanged() {
    let server = TestServer::start(vec![("/search", search_page(200, RESULTS))]).await;
    std::env::set_var("PF_TEST_GATEWAY_KEY", "sekrit-gateway");
    let web = active(searching(
        SearchBackend::Gateway,
        server.url("/search"),
        Some("PF_TEST_GATEWAY_KEY"),
    ))
    .await;
    let arguments = json!({"query": "rust async runtime", "count": 5, "freshness": "pw",
                           "safesearch": "strict", "include_domains": ["example.com"]});
    assert_eq!(search(&web, arguments.clone()).await, soft(RESULTS));
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "POST");
    assert_eq!(seen[0].target, "/search");
    assert_eq!(
        seen[0].headers.get("content-type").map(String::as_str),
        Some("application/json")
    );
    assert_eq!(
        seen[0].headers.get("authorization").map(String::as_str),
        Some("Bearer sekrit-gateway")
    );
    let sent: Json = serde_json::from_slice(&seen[0].body).expect("json body");
    assert_eq!(sent, arguments);
    assert_eq!(
        String::from_utf8_lossy(&seen[0].body),
        arguments.to_string(),
        "fields keep their order"
    );
}

#[tokio::test]
async fn invalid_search_arguments_send_nothing() {
    let server = TestServer::start(vec![("/search", search_page(200, RESULTS))]).await;
    let web = active(searching(
        SearchBackend::Gateway,
        server.url("/search"),
        None,
    ))
    .await;
    for (arguments, message) in [
        (json!({}), "web_search: invalid arguments"),
        (
            json!({"query": "q", "page": 2}),
            "web_search: invalid arguments",
        ),
        (
            json!({"query": "   "}),
            "web_search: query must not be empty",
        ),
        (
            json!({"query": "q".repeat(401)}),
            "web_search: query exceeds 400 characters",
        ),
        (
            json!({"query": "q", "count": 21}),
            "web_search: count must be between 1 and 20",
        ),
        (
            json!({"query": "q", "count": -1}),
            "web_search: invalid arguments",
        ),
        (
            json!({"query": "q", "freshness": "pz"}),
            "web_search: invalid arguments",
        ),
        (
            json!({"query": "q", "country": ""}),
            "web_search: country must be 1..=128 characters",
        ),
        (
            json!({"query": "q", "include_domains": ["https://example.com/x"]}),
            "web_search: include_domains contains an invalid hostname",
        ),
    ] {
        assert_eq!(
            search(&web, arguments.clone()).await,
            hard(message),
            "{arguments}"
        );
    }
    assert!(server.seen().is_empty());
}

#[tokio::test]
async fn gateway_failures_are_named() {
    let mut cut = search_page(500, "partial");
    cut.declared_length = Some(1000);
    let server = TestServer::start(vec![
        (
            "/boom",
            page(500, Some("text/plain"), "it\nbroke\t\u{1b}[31m"),
        ),
        ("/empty", page(503, Some("text/plain"), "")),
        ("/cut", cut),
        (
            "/huge",
            search_page(
                200,
                format!("{{\"results\": [], \"pad\": \"{}\"}}", "x".repeat(262_144)),
            ),
        ),
        (
            "/latin",
            search_page(200, b"{\"results\": [{\"url\": \"caf\xe9\"}]}".to_vec()),
        ),
        ("/not-json", search_page(200, "<html>")),
        ("/no-results", search_page(200, "{\"items\": []}")),
        (
            "/no-url",
            search_page(200, "{\"results\": [{\"title\": \"t\"}]}"),
        ),
        (
            "/blank-url",
            search_page(
                200,
                "{\"results\": [{\"url\": \"https://a\"}, {\"url\": \" \"}]}",
            ),
        ),
    ])
    .await;
    for (path, message) in [
        (
            "/boom",
            "web_search: backend returned 500: it\\nbroke\\t\\u{001b}[31m",
        ),
        ("/empty", "web_search: backend returned 503: (empty body)"),
        (
            "/cut",
            "web_search: backend returned 500, and its error body could not be read",
        ),
        ("/huge", "web_search: response body exceeded 262144 bytes"),
        ("/latin", "web_search: response body was not valid UTF-8"),
        ("/not-json", "web_search: malformed search response"),
        ("/no-results", "web_search: malformed search response"),
        ("/no-url", "web_search: malformed search response"),
        (
            "/blank-url",
            "web_search: malformed search response: result 1 has an empty url",
        ),
    ] {
        let web = active(searching(SearchBackend::Gateway, server.url(path), None)).await;
        assert_eq!(
            search(&web, json!({"query": "q"})).await,
            hard(message),
            "{path}"
        );
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    drop(listener);
    let web = active(searching(
        SearchBackend::Gateway,
        format!("http://{address}/search"),
        None,
    ))
    .await;
    assert_eq!(
        search(&web, json!({"query": "q"})).await,
        hard("web_search: request failed")
    );
}

#[tokio::test]
async fn searxng_is_asked_with_its_own_parameters_and_mapped() {
    let answer = json!({"query": "q", "results": [
        {"title": "A", "url": "https://a.example.com/1", "content": "first", "engine": "x"},
        {"title": "B", "url": "https://skip.example.org/2", "content": "second"},
        {"title": "C", "url": "https://example.com/3", "content": "third"},
        {"title": "D", "url": "https://example.com/4", "content": "fourth"}
    ]});
    let server = TestServer::start(vec![("/search", search_page(200, answer.to_string()))]).await;
    let web = active(searching(
        SearchBackend::Searxng,
        server.url("/search"),
        None,
    ))
    .await;
    let result = search(
        &web,
        json!({"query": "tide pools", "count": 2, "search_lang": "en", "country": "US",
               "safesearch": "moderate", "freshness": "pm", "include_domains": ["example.com"]}),
    )
    .await
    .expect("searched");
    let result: Json = serde_json::from_str(&result).expect("json");
    assert_eq!(
        result,
        json!({"results": [
            {"title": "A", "url": "https://a.example.com/1", "description": "first"},
            {"title": "C", "url": "https://example.com/3", "description": "third"}
        ]})
    );
    let seen = server.seen();
    assert_eq!(seen[0].method, "GET");
    assert_eq!(
        seen[0].target,
        "/search?q=tide+pools&format=json&language=en-US&safesearch=1&time_range=month"
    );
}

#[tokio::test]
async fn brave_gets_its_key_in_a_header_and_is_mapped() {
    let answer = json!({"type": "search", "web": {"results": [
        {"title": "A", "url": "https://a.example/", "description": "first", "age": "1d"},
        {"title": "Bad", "url": "https://bad.example/", "description": "dropped"}
    ]}});
    let server = TestServer::start(vec![
        ("/res/v1/web/search", search_page(200, answer.to_string())),
        ("/nothing", search_page(200, "{\"type\": \"search\"}")),
        (
            "/denied",
            page(401, Some("application/json"), "{\"error\":\"bad token\"}"),
        ),
    ])
    .await;
    std::env::set_var("PF_TEST_BRAVE_KEY", "sekrit-brave");
    let web = active(searching(
        SearchBackend::Brave,
        server.url("/res/v1/web/search"),
        Some("PF_TEST_BRAVE_KEY"),
    ))
    .await;
    let result = search(
        &web,
        json!({"query": "q", "count": 3, "country": "DE", "exclude_domains": ["bad.example"]}),
    )
    .await
    .expect("searched");
    assert_eq!(
        serde_json::from_str::<Json>(&result).expect("json"),
        json!({"results": [{"title": "A", "url": "https://a.example/", "description": "first"}]})
    );
    let seen = server.seen();
    assert_eq!(seen[0].method, "GET");
    assert_eq!(
        seen[0].target,
        "/res/v1/web/search?q=q+-site%3Abad.example&count=3&country=DE"
    );
    assert_eq!(
        seen[0]
            .headers
            .get("x-subscription-token")
            .map(String::as_str),
        Some("sekrit-brave")
    );
    assert!(!seen[0].headers.contains_key("authorization"));

    let empty = active(searching(
        SearchBackend::Brave,
        server.url("/nothing"),
        Some("PF_TEST_BRAVE_KEY"),
    ))
    .await;
    assert_eq!(
        search(&empty, json!({"query": "q"})).await,
        soft("{\"results\":[]}")
    );

    let denied = active(searching(
        SearchBackend::Brave,
        server.url("/denied"),
        Some("PF_TEST_BRAVE_KEY"),
    ))
    .await;
    let failure = search(&denied, json!({"query": "q"})).await;
    assert_eq!(
        failure,
        hard("web_search: backend returned 401: {\"error\":\"bad token\"}")
    );

    let keyless = active(searching(
        SearchBackend::Brave,
        server.url("/nothing"),
        Some("PF_TEST_NO_SUCH_KEY"),
    ))
    .await;
    assert_eq!(
        search(&keyless, json!({"query": "q"})).await,
        hard("web_search: the search API key variable PF_TEST_NO_SUCH_KEY is not set")
    );
}

// ---------------------------------------------------------------------------
// Fetch: compressed bodies
// ---------------------------------------------------------------------------

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(data).expect("compressed");
    encoder.finish().expect("compressed")
}

fn zlib(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(data).expect("compressed");
    encoder.finish().expect("compressed")
}

fn brotli_of(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut input = data;
    let params = brotli::enc::BrotliEncoderParams::default();
    brotli::BrotliCompress(&mut input, &mut out, &params).expect("compressed");
    out
}

/// Gzip of `size` zero bytes made by python3's C zlib (fast, unlike a debug build).
fn gzip_bomb(size: usize) -> Vec<u8> {
    let output = std::process::Command::new("python3")
        .args([
            "-c",
            "import gzip,sys; sys.stdout.buffer.write(gzip.compress(bytes(int(sys.argv[1])), 9))",
            &size.to_string(),
        ])
        .output()
        .expect("python3 runs");
    assert!(output.status.success());
    output.stdout
}

fn encoded(content_type: &str, encoding: &str, body: Vec<u8>) -> Page {
    let mut page = page(200, Some(content_type), body);
    page.headers
        .push(("Content-Encoding".to_string(), encoding.to_string()));
    page
}

#[tokio::test]
async fn gzip_brotli_and_deflate_bodies_come_back_decoded() {
    let article = format!(
        "<html><body><article><h1>Packed</h1><p>{}</p></article></body></html>",
        "Compressed pages read like any other page. ".repeat(10)
    );
    let json = br#"{"packed":true,"n":[1,2,3]}"#.to_vec();
    let latin1 = b"caf\xe9 cr\xe8me".to_vec();
    let server = TestServer::start(vec![
        (
            "/a.html",
            encoded("text/html", "gzip", gzip(article.as_bytes())),
        ),
        (
            "/a.json",
            encoded("application/json", "br", brotli_of(&json)),
        ),
        (
            "/a.txt",
            encoded("text/plain", "deflate", zlib(b"deflated text")),
        ),
        (
            "/latin.txt",
            encoded("text/plain; charset=ISO-8859-1", "gzip", gzip(&latin1)),
        ),
    ])
    .await;
    let web = active(WebPlugin::new(loopback_config())).await;
    let html = fetch(&web, json!({"url": server.url("/a.html")}))
        .await
        .expect("fetched");
    assert!(html.contains("extraction: readability"), "{html}");
    assert!(
        html.contains("Compressed pages read like any other page."),
        "{html}"
    );
    assert_eq!(
        fetch(&web, json!({"url": server.url("/a.json")})).await,
        soft(&format!(
            "url: {}\ntruncated: false\nextraction: plain\n\n{{\"packed\":true,\"n\":[1,2,3]}}",
            server.url("/a.json")
        ))
    );
    assert_eq!(
        fetch(&web, json!({"url": server.url("/a.txt")})).await,
        soft(&format!(
            "url: {}\ntruncated: false\nextraction: plain\n\ndeflated text",
            server.url("/a.txt")
        ))
    );
    assert_eq!(
        fetch(&web, json!({"url": server.url("/latin.txt")})).await,
        soft(&format!(
            "url: {}\ntruncated: false\nextraction: plain\n\ncafé crème",
            server.url("/latin.txt")
        ))
    );
    let asked = server.seen();
    let accepted = asked[0]
        .headers
        .get("accept-encoding")
        .cloned()
        .unwrap_or_default();
    for coding in ["gzip", "br", "deflate"] {
        assert!(accepted.contains(coding), "{accepted}");
    }
}

#[tokio::test]
async fn the_cap_counts_decompressed_bytes_and_a_bomb_stops_at_it() {
    let cap = 8 * 1024 * 1024;
    // 64 MiB of zeros in about 64 KiB: small on the wire, far over the cap.
    let bomb = gzip_bomb(64 * 1024 * 1024);
    assert!(bomb.len() < cap / 16);
    // Half the compressed bytes, then the connection stays open: a reader
    // that did not stop at the cap would wait for the rest and time out.
    let mut stalled = encoded("application/json", "gzip", bomb[..bomb.len() / 2].to_vec());
    stalled.declared_length = Some(bomb.len());
    stalled.hold_open = true;
    let mut stalled_text = stalled.clone();
    stalled_text.headers = vec![
        ("Content-Type".into(), "text/plain".into()),
        ("Content-Encoding".into(), "gzip".into()),
    ];
    let exact = gzip(&vec![b'e'; cap]);
    let over = brotli_of(&vec![b'o'; cap + 1]);
    let server = TestServer::start(vec![
        (
            "/bomb.json",
            encoded("application/json", "gzip", bomb.clone()),
        ),
        ("/stalled.json", stalled),
        ("/stalled.txt", stalled_text),
        ("/exact.json", encoded("application/json", "gzip", exact)),
        ("/over.html", encoded("text/html", "br", over)),
        (
            "/broken.txt",
            encoded("text/plain", "gzip", b"\x1f\x8b\x08garbage".to_vec()),
        ),
    ])
    .await;
    let limits = FetchLimits {
        max_chars: usize::MAX,
        request_timeout: Duration::from_secs(60),
        ..FetchLimits::default()
    };
    let web = active(WebPlugin::new(loopback_config()).with_limits(limits)).await;
    let over_cap = |path: &str| {
        soft(&format!(
            "response from {} exceeds the 8388608-byte size cap",
            server.url(path)
        ))
    };
    assert_eq!(
        fetch(&web, json!({"url": server.url("/bomb.json")})).await,
        over_cap("/bomb.json")
    );
    assert_eq!(
        fetch(&web, json!({"url": server.url("/stalled.json")})).await,
        over_cap("/stalled.json")
    );
    assert_eq!(
        fetch(&web, json!({"url": server.url("/over.html")})).await,
        over_cap("/over.html")
    );
    // Flat text is cut at the cap, counted in expanded bytes.
    let cut = fetch(&web, json!({"url": server.url("/stalled.txt")}))
        .await
        .expect("fetched");
    let (head, body) = cut.split_once("\n\n").expect("a header");
    assert_eq!(
        head,
        format!(
            "url: {}\ntruncated: true\nextraction: plain",
            server.url("/stalled.txt")
        )
    );
    assert_eq!(body.len(), cap);
    // Exactly the cap after decompression is accepted.
    let exact = fetch(&web, json!({"url": server.url("/exact.json")}))
        .await
        .expect("fetched");
    assert!(exact.contains("truncated: false"), "{}", &exact[..80]);
    assert!(exact.ends_with(&"e".repeat(1000)));
    // A body that does not decompress is a body that could not be read.
    assert_eq!(
        fetch(&web, json!({"url": server.url("/broken.txt")})).await,
        soft(&format!(
            "the response body from {} could not be read; try again or use a different URL",
            server.url("/broken.txt")
        ))
    );
}

// ---------------------------------------------------------------------------
// Fetch: allow_loopback loosens loopback only
// ---------------------------------------------------------------------------

#[tokio::test]
async fn allow_loopback_keeps_the_port_and_scheme_rules_for_every_other_host() {
    let server = TestServer::start(vec![
        ("/to-port", redirect("https://public.example:8443/x")),
        ("/to-http", redirect("http://public.example/x")),
        ("/to-local-port", redirect("/here")),
        (
            "/here",
            page(200, Some("text/plain"), "loopback on its own port"),
        ),
    ])
    .await;
    let port = server.base.rsplit(':').next().unwrap_or("").to_string();
    let resolver = table(&[
        ("public.example", &["93.184.216.34"]),
        ("both.example", &["93.184.216.34", "127.0.0.1"]),
    ]);
    let web = active(WebPlugin::new(loopback_config()).with_resolver(resolver)).await;
    // Refused before any connection: the public address is never tried.
    assert_eq!(
        fetch(&web, json!({"url": "https://public.example:8443/"})).await,
        hard("port not allowed: 8443")
    );
    assert_eq!(
        fetch(&web, json!({"url": "http://public.example/"})).await,
        soft("scheme not allowed: http")
    );
    assert_eq!(
        fetch(&web, json!({"url": "https://93.184.216.34:8443/"})).await,
        hard("port not allowed: 8443")
    );
    assert_eq!(
        fetch(&web, json!({"url": "http://10.1.2.3:8080/"})).await,
        soft("scheme not allowed: http")
    );
    // The same rules hold on redirect hops.
    assert_eq!(
        fetch(&web, json!({"url": server.url("/to-port")})).await,
        soft(&format!(
            "redirect from {} to https://public.example:8443/x refused: port not allowed: 8443",
            server.url("/to-port")
        ))
    );
    assert_eq!(
        fetch(&web, json!({"url": server.url("/to-http")})).await,
        soft(&format!(
            "redirect from {} to http://public.example/x refused: scheme not allowed: http",
            server.url("/to-http")
        ))
    );
    // A name with a loopback address reaches only that address on a loosened port.
    let url = format!("http://both.example:{port}/here");
    assert_eq!(
        fetch(&web, json!({"url": url})).await,
        soft(&format!(
            "url: {url}\ntruncated: false\nextraction: plain\n\nloopback on its own port"
        ))
    );
    assert_eq!(
        fetch(&web, json!({"url": server.url("/to-local-port")})).await,
        soft(&format!(
            "url: {}\ntruncated: false\nextraction: plain\n\nloopback on its own port",
            server.url("/here")
        ))
    );
    let targets: Vec<String> = server.seen().into_iter().map(|s| s.target).collect();
    assert_eq!(
        targets,
        ["/to-port", "/to-http", "/here", "/to-local-port", "/here"]
    );
}
