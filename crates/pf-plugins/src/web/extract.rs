//! Turning a response body into text: content types, charsets, and HTML to
//! markdown (main-article extraction or the whole page).

use html2text::{Element, Handle};

/// How a response body is processed, decided by its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyKind {
    /// `text/html`, `application/xhtml+xml`: extracted to markdown.
    Html,
    /// JSON and XML: returned whole; over the byte cap it is refused.
    Structured,
    /// Any other `text/*`: returned as is; over the byte cap it is cut.
    Flat,
}

/// A parsed `Content-Type` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ContentType {
    pub kind: BodyKind,
    /// The `charset` parameter as written, quotes removed.
    pub charset: Option<String>,
}

/// Classifies a `Content-Type` value; `None` when it does not parse or names
/// a type outside the accepted set.
pub(crate) fn classify_content_type(value: &str) -> Option<ContentType> {
    let mut parts = value.split(';');
    let essence = parts.next()?.trim().to_ascii_lowercase();
    let (top, sub) = essence.split_once('/')?;
    if !is_token(top) || !is_token(sub) {
        return None;
    }
    let structured_sub = |sub: &str| {
        sub == "json" || sub == "xml" || sub.ends_with("+json") || sub.ends_with("+xml")
    };
    let kind = match top {
        "text" if sub == "html" => BodyKind::Html,
        "application" if sub == "xhtml+xml" => BodyKind::Html,
        "application" | "text" if structured_sub(sub) => BodyKind::Structured,
        "text" => BodyKind::Flat,
        _ => return None,
    };
    let charset = parts.find_map(|parameter| {
        let (name, value) = parameter.split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("charset") {
            return None;
        }
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value);
        Some(value.to_string())
    });
    Some(ContentType { kind, charset })
}

/// RFC 9110 token characters.
fn is_token(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The decoder for a declared charset; `Err` when the label is unknown.
pub(crate) fn decoder_for(charset: Option<&str>) -> Result<&'static encoding_rs::Encoding, String> {
    match charset {
        None => Ok(encoding_rs::UTF_8),
        Some(label) => encoding_rs::Encoding::for_label(label.trim().as_bytes())
            .ok_or_else(|| label.to_string()),
    }
}

/// Decodes with the declared encoding only (no BOM sniffing), replacing
/// invalid sequences.
pub(crate) fn decode(bytes: &[u8], encoding: &'static encoding_rs::Encoding) -> String {
    let (text, _had_errors) = encoding.decode_without_bom_handling(bytes);
    text.into_owned()
}

/// How fetched text was produced, as the `extraction:` header line says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extraction {
    Readability,
    RawHtml,
    Plain,
}

impl Extraction {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Extraction::Readability => "readability",
            Extraction::RawHtml => "raw-html",
            Extraction::Plain => "plain",
        }
    }
}

/// An article shorter than this (bytes, trimmed) falls back to the whole page.
const MIN_ARTICLE_BYTES: usize = 100;

/// Render width: wide enough that prose lines are not re-wrapped.
const RENDER_WIDTH: usize = 400;

/// Renders an HTML page to markdown: the main article, or the whole page when
/// `raw` is set or the article is too short. Never fails; the worst case is
/// empty text.
pub(crate) fn html_to_markdown(html: &str, raw: bool) -> (String, Extraction) {
    let html = flatten_deep_markup(html, MAX_MARKUP_DEPTH);
    let html = html.as_ref();
    if !raw {
        if let Some(article) = extract_article(html) {
            if article.trim().len() >= MIN_ARTICLE_BYTES {
                return (article, Extraction::Readability);
            }
        }
    }
    (render_whole_page(html), Extraction::RawHtml)
}

fn config() -> html2text::config::Config<html2text::render::PlainDecorator> {
    html2text::config::plain()
        .allow_width_overflow()
        .no_link_wrapping()
}

fn render_whole_page(html: &str) -> String {
    let config = config();
    let rendered = config
        .parse_html(html.as_bytes())
        .and_then(|dom| {
            limit_depth(&dom.document);
            config.dom_to_render_tree(&dom)
        })
        .and_then(|tree| config.render_to_string(tree, RENDER_WIDTH));
    tidy(rendered.unwrap_or_default())
}

/// Deepest tag nesting handed to the HTML parser. The parser's work per tag
/// grows with the nesting depth, so a page nested thousands deep would pin a
/// core for minutes; real pages stay far below this.
const MAX_MARKUP_DEPTH: usize = 128;

/// Elements with no end tag, or an end tag pages often leave out: they do not
/// count towards the nesting depth.
const NOT_NESTING: [&str; 33] = [
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
    "wbr", "param", "keygen", "p", "li", "dt", "dd", "option", "optgroup", "tr", "td", "th",
    "thead", "tbody", "tfoot", "colgroup", "rt", "rp", "html", "head", "body",
];

/// Drops the tags (never the text) that sit deeper than `limit` by a cheap
/// count of start and end tags; returns the page unchanged when none do.
fn flatten_deep_markup(html: &str, limit: usize) -> std::borrow::Cow<'_, str> {
    let bytes = html.as_bytes();
    let mut out: Option<String> = None;
    let mut depth = 0usize;
    let mut copied_to = 0usize;
    let mut at = 0usize;
    while let Some(offset) = bytes
        .get(at..)
        .and_then(|rest| rest.iter().position(|b| *b == b'<'))
    {
        let start = at + offset;
        let rest = bytes.get(start + 1..).unwrap_or_default();
        if rest.starts_with(b"!--") {
            at = find(bytes, start + 4, b"-->").map_or(bytes.len(), |end| end + 3);
            continue;
        }
        let closing = rest.first() == Some(&b'/');
        let name_start = start + 1 + usize::from(closing);
        let name_len = bytes
            .get(name_start..)
            .unwrap_or_default()
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric())
            .count();
        let starts_with_letter = bytes.get(name_start).is_some_and(u8::is_ascii_alphabetic);
        if name_len == 0 || !starts_with_letter {
            at = start + 1;
            continue;
        }
        let name = html
            .get(name_start..name_start + name_len)
            .unwrap_or("")
            .to_ascii_lowercase();
        let end = find(bytes, name_start, b">").map_or(bytes.len(), |end| end + 1);
        let self_closing = end >= 2 && bytes.get(end - 2) == Some(&b'/');
        let nests = !NOT_NESTING.contains(&name.as_str()) && !self_closing;
        let mut drop_tag = false;
        if nests && closing {
            drop_tag = depth > limit;
            depth = depth.saturating_sub(1);
        } else if nests {
            depth += 1;
            drop_tag = depth > limit;
        }
        if drop_tag {
            let kept = out.get_or_insert_with(|| String::with_capacity(html.len()));
            kept.push_str(html.get(copied_to..start).unwrap_or(""));
            copied_to = end;
        }
        at = end;
        // Script and style bodies are text to the parser, whatever `<` they hold.
        if !closing && (name == "script" || name == "style") {
            let close = format!("</{name}").into_bytes();
            at = find_ignore_case(bytes, end, &close).unwrap_or(bytes.len());
        }
    }
    match out {
        Some(mut kept) => {
            kept.push_str(html.get(copied_to..).unwrap_or(""));
            std::borrow::Cow::Owned(kept)
        }
        None => std::borrow::Cow::Borrowed(html),
    }
}

fn find(haystack: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    haystack
        .get(from..)?
        .windows(needle.len())
        .position(|window| window == needle)
        .map(|offset| from + offset)
}

fn find_ignore_case(haystack: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    haystack
        .get(from..)?
        .windows(needle.len())
        .position(|window| window.eq_ignore_ascii_case(needle))
        .map(|offset| from + offset)
}

/// Deepest element nesting handed to the renderer, which recurses per level.
const MAX_DEPTH: usize = 256;

/// Flattens anything nested deeper than [`MAX_DEPTH`]: the leaves (text
/// included) below that level become direct children of the node at it, in
/// document order, so a hostile page cannot exhaust the stack.
fn limit_depth(root: &Handle) {
    let mut stack = vec![(root.clone(), 0usize)];
    while let Some((node, depth)) = stack.pop() {
        if depth >= MAX_DEPTH {
            let mut leaves = Vec::new();
            let mut pending: Vec<Handle> = std::mem::take(&mut *node.children.borrow_mut());
            pending.reverse();
            while let Some(next) = pending.pop() {
                let children = std::mem::take(&mut *next.children.borrow_mut());
                if children.is_empty() {
                    leaves.push(next);
                } else {
                    pending.extend(children.into_iter().rev());
                }
            }
            *node.children.borrow_mut() = leaves;
            continue;
        }
        let children = node.children.borrow();
        stack.extend(children.iter().map(|child| (child.clone(), depth + 1)));
    }
}

/// Finds the main article, drops the boilerplate inside it, and renders it.
fn extract_article(html: &str) -> Option<String> {
    let config = config();
    let dom = config.parse_html(html.as_bytes()).ok()?;
    limit_depth(&dom.document);
    let body = find_element(&dom.document, "body")?;
    strip_boilerplate(&body);
    let article = choose_article(&body).unwrap_or_else(|| body.clone());
    // Render only the chosen node: make it the body's sole child.
    if !std::rc::Rc::ptr_eq(&article, &body) {
        *body.children.borrow_mut() = vec![article];
    }
    let rendered = config
        .dom_to_render_tree(&dom)
        .and_then(|tree| config.render_to_string(tree, RENDER_WIDTH))
        .ok()?;
    Some(tidy(rendered))
}

/// Trailing spaces off every line, no runs of blank lines, no blank ends.
fn tidy(text: String) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank_run = 0usize;
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            blank_run += 1;
            continue;
        }
        if !out.is_empty() {
            out.push('\n');
            if blank_run > 0 {
                out.push('\n');
            }
        }
        blank_run = 0;
        out.push_str(line);
    }
    out
}

fn element_name(node: &Handle) -> Option<String> {
    match &node.data {
        Element { name, .. } => Some(name.local.to_string()),
        _ => None,
    }
}

fn attribute(node: &Handle, wanted: &str) -> Option<String> {
    match &node.data {
        Element { attrs, .. } => attrs
            .borrow()
            .iter()
            .find(|a| a.name.local.as_ref() == wanted)
            .map(|a| a.value.to_string()),
        _ => None,
    }
}

fn find_element(node: &Handle, wanted: &str) -> Option<Handle> {
    let mut stack = vec![node.clone()];
    while let Some(current) = stack.pop() {
        if element_name(&current).as_deref() == Some(wanted) {
            return Some(current);
        }
        let children = current.children.borrow();
        stack.extend(children.iter().rev().cloned());
    }
    None
}

/// Elements that never hold article text.
const NEVER_CONTENT: [&str; 14] = [
    "script", "style", "noscript", "template", "nav", "aside", "form", "iframe", "svg", "button",
    "select", "input", "dialog", "menu",
];

/// ARIA roles of page furniture.
const BOILERPLATE_ROLES: [&str; 6] = [
    "navigation",
    "banner",
    "contentinfo",
    "complementary",
    "search",
    "dialog",
];

/// class/id words that mark page furniture.
const BOILERPLATE_WORDS: [&str; 16] = [
    "nav",
    "navbar",
    "menu",
    "footer",
    "sidebar",
    "breadcrumb",
    "breadcrumbs",
    "cookie",
    "cookies",
    "banner",
    "share",
    "social",
    "advert",
    "ads",
    "related",
    "comments",
];

fn is_boilerplate(node: &Handle, inside_article: bool) -> bool {
    let Some(name) = element_name(node) else {
        return false;
    };
    if NEVER_CONTENT.contains(&name.as_str()) {
        return true;
    }
    // A page's header and footer are furniture; an article's own are not.
    if (name == "header" || name == "footer") && !inside_article {
        return true;
    }
    if let Some(role) = attribute(node, "role") {
        if BOILERPLATE_ROLES.contains(&role.trim().to_ascii_lowercase().as_str()) {
            return true;
        }
    }
    if attribute(node, "hidden").is_some()
        || attribute(node, "aria-hidden").as_deref() == Some("true")
    {
        return true;
    }
    let marks = format!(
        "{} {}",
        attribute(node, "class").unwrap_or_default(),
        attribute(node, "id").unwrap_or_default()
    )
    .to_ascii_lowercase();
    marks
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|word| BOILERPLATE_WORDS.contains(&word))
}

/// Removes furniture subtrees, iteratively so deep documents cannot overflow the stack.
fn strip_boilerplate(root: &Handle) {
    let mut stack = vec![(root.clone(), false)];
    while let Some((node, inside_article)) = stack.pop() {
        let here = inside_article
            || matches!(
                element_name(&node).as_deref(),
                Some("article") | Some("main")
            );
        node.children
            .borrow_mut()
            .retain(|child| !is_boilerplate(child, here));
        let children = node.children.borrow();
        stack.extend(children.iter().map(|child| (child.clone(), here)));
    }
}

/// The main content node: an explicit `<article>`/`<main>` when the page has
/// one, else the container holding the most paragraphs.
fn choose_article(body: &Handle) -> Option<Handle> {
    let mut explicit: Option<(Handle, usize)> = None;
    let mut best: Option<(Handle, usize)> = None;
    let mut stack = vec![body.clone()];
    while let Some(node) = stack.pop() {
        let name = element_name(&node);
        let children = node.children.borrow();
        let paragraphs = children
            .iter()
            .filter(|child| {
                matches!(
                    element_name(child).as_deref(),
                    Some("p")
                        | Some("pre")
                        | Some("blockquote")
                        | Some("ul")
                        | Some("ol")
                        | Some("table")
                )
            })
            .count();
        let marked = matches!(name.as_deref(), Some("article") | Some("main"))
            || attribute(&node, "role").as_deref() == Some("main");
        if marked {
            let weight = count_descendants(&node, "p") + 1;
            if explicit.as_ref().is_none_or(|(_, w)| weight > *w) {
                explicit = Some((node.clone(), weight));
            }
        }
        if paragraphs > 0 && best.as_ref().is_none_or(|(_, w)| paragraphs > *w) {
            best = Some((node.clone(), paragraphs));
        }
        stack.extend(children.iter().cloned());
    }
    explicit.or(best).map(|(node, _)| node)
}

fn count_descendants(node: &Handle, wanted: &str) -> usize {
    let mut count = 0;
    let mut stack = vec![node.clone()];
    while let Some(current) = stack.pop() {
        if element_name(&current).as_deref() == Some(wanted) {
            count += 1;
        }
        stack.extend(current.children.borrow().iter().cloned());
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_sort_into_html_structured_flat_or_refused() {
        let kind = |v: &str| classify_content_type(v).map(|c| c.kind);
        assert_eq!(kind("text/html; charset=utf-8"), Some(BodyKind::Html));
        assert_eq!(kind("application/xhtml+xml"), Some(BodyKind::Html));
        assert_eq!(kind("application/json"), Some(BodyKind::Structured));
        assert_eq!(kind("application/ld+json"), Some(BodyKind::Structured));
        assert_eq!(kind("application/atom+xml"), Some(BodyKind::Structured));
        assert_eq!(kind("text/xml"), Some(BodyKind::Structured));
        assert_eq!(kind("Text/JSON"), Some(BodyKind::Structured));
        assert_eq!(kind("text/plain"), Some(BodyKind::Flat));
        assert_eq!(kind("text/csv"), Some(BodyKind::Flat));
        assert_eq!(kind("text/markdown"), Some(BodyKind::Flat));
        assert_eq!(kind("application/pdf"), None);
        assert_eq!(kind("application/octet-stream"), None);
        assert_eq!(kind("application/javascript"), None);
        assert_eq!(kind("image/svg+xml"), None);
        assert_eq!(kind("garbage"), None);
        assert_eq!(kind("text/"), None);
        assert_eq!(kind("te xt/plain"), None);
    }

    #[test]
    fn charset_parameter_is_read_verbatim() {
        let charset = |v: &str| classify_content_type(v).and_then(|c| c.charset);
        assert_eq!(
            charset("text/plain; charset=ISO-8859-1"),
            Some("ISO-8859-1".into())
        );
        assert_eq!(
            charset("text/plain;CHARSET=\"utf-8\""),
            Some("utf-8".into())
        );
        assert_eq!(charset("text/plain"), None);
    }

    #[test]
    fn known_charsets_decode_and_unknown_ones_are_named() {
        let latin1 = decoder_for(Some("ISO-8859-1")).expect("known");
        assert_eq!(decode(b"caf\xe9", latin1), "café");
        let sjis = decoder_for(Some("shift_jis")).expect("known");
        assert_eq!(decode(b"\x82\xa0", sjis), "あ");
        assert_eq!(
            decode(b"ok\xff", decoder_for(None).expect("utf8")),
            "ok\u{fffd}"
        );
        assert_eq!(
            decoder_for(Some("not-a-charset")).err(),
            Some("not-a-charset".to_string())
        );
    }

    const ARTICLE_PAGE: &str = "<html><head><title>T</title><script>var x = 1;</script></head><body>\
        <nav><a href=\"/\">Home</a> <a href=\"/about\">About us</a></nav>\
        <header>Site banner text</header>\
        <article><h1>The Tide Pools</h1>\
        <p>Tide pools are rocky pools on the seashore which are separated from the sea at low tide.</p>\
        <p>They are home to <em>anemones</em>, <strong>starfish</strong> and crabs.</p></article>\
        <footer>Copyright footer text</footer></body></html>";

    #[test]
    fn article_extraction_drops_navigation_and_footer() {
        let (text, extraction) = html_to_markdown(ARTICLE_PAGE, false);
        assert_eq!(extraction, Extraction::Readability);
        assert!(text.starts_with("# The Tide Pools"), "{text}");
        assert!(text.contains("Tide pools are rocky pools on the seashore"));
        assert!(text.contains("starfish"));
        assert!(!text.contains("About us"), "{text}");
        assert!(!text.contains("Copyright footer"), "{text}");
        assert!(!text.contains("Site banner"), "{text}");
        assert!(!text.contains("var x"), "{text}");
    }

    #[test]
    fn raw_rendering_keeps_the_whole_page() {
        let (text, extraction) = html_to_markdown(ARTICLE_PAGE, true);
        assert_eq!(extraction, Extraction::RawHtml);
        assert!(text.contains("About us"), "{text}");
        assert!(text.contains("Copyright footer text"), "{text}");
        assert!(text.contains("starfish"));
    }

    #[test]
    fn short_article_falls_back_to_the_whole_page() {
        let page = "<html><body><nav>Menu entry</nav><p>Short.</p></body></html>";
        let (text, extraction) = html_to_markdown(page, false);
        assert_eq!(extraction, Extraction::RawHtml);
        assert!(text.contains("Menu entry"));
        assert!(text.contains("Short."));
    }

    #[test]
    fn paragraph_dense_container_wins_without_article_markup() {
        let para = "<p>This paragraph carries the real content of the page and is long enough.</p>";
        let page = format!(
            "<html><body><div class=\"menu\"><p>Sign in</p></div><div id=\"x\"><div>Side</div></div>\
             <div id=\"story\">{para}{para}{para}</div></body></html>"
        );
        let (text, extraction) = html_to_markdown(&page, false);
        assert_eq!(extraction, Extraction::Readability);
        assert!(!text.contains("Sign in"), "{text}");
        assert!(!text.contains("Side"), "{text}");
        assert_eq!(text.matches("real content").count(), 3);
    }

    #[test]
    fn rendering_never_fails_on_garbage() {
        let (text, _) = html_to_markdown("<<<>>\u{0}</x", false);
        assert!(text.len() < 100);
        let (text, extraction) = html_to_markdown("", false);
        assert_eq!((text.as_str(), extraction), ("", Extraction::RawHtml));
    }

    #[test]
    fn markup_nested_too_deep_is_flattened_before_parsing() {
        let depth = 50_000;
        let page = format!(
            "<html><body>{}<p>deep text</p>{}</body></html>",
            "<div>".repeat(depth),
            "</div>".repeat(depth)
        );
        // Run on its own thread with a 60 s liveness guard (not a speed
        // assertion): unflattened, this depth overflows the stack or runs on.
        let (done, converted) = std::sync::mpsc::channel();
        let deep_page = page.clone();
        std::thread::spawn(move || {
            let _ = done.send(html_to_markdown(&deep_page, false).0);
        });
        let text = converted
            .recv_timeout(std::time::Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("hung or failed: no text from the deep page ({e})"));
        assert_eq!(text, "deep text");
        let flat = flatten_deep_markup(&page, 3);
        assert_eq!(
            flat,
            "<html><body><div><div><div><p>deep text</p></div></div></div></body></html>"
        );
    }

    #[test]
    fn ordinary_markup_is_left_alone() {
        let page = "<html><body><div><p>a<p>b<br><img src=x><ul><li>c<li>d</ul></div>\
            <script>for (i = 0; i<n; i++) { if (a<b) {} }</script><!-- <div><div> --></body></html>";
        assert!(matches!(
            flatten_deep_markup(page, 3),
            std::borrow::Cow::Borrowed(_)
        ));
        let siblings = format!(
            "<div>{}</div>",
            "<script>if (a<b) {}</script><style>p{}</style><div>x</div>".repeat(300)
        );
        assert!(matches!(
            flatten_deep_markup(&siblings, 3),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
