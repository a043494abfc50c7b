//! A local OpenAI-compatible chat-completions mock for `bench/test_command.sh`:
//! every POST gets the same one-round answer, over keep-alive connections, a
//! thread per connection. Prints its port, then serves until killed.
//!
//! `mock_openai --load N J URL` is the bare baseline instead: N requests to
//! URL from J threads over keep-alive connections, and the rate the mock served.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

const ANSWER: &str = r#"{"id":"bench","object":"chat.completion","model":"mock-1","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"pong"}}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}"#;

/// One request's head and body; `None` when the peer closed the connection.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<()> {
    let mut length = 0usize;
    let mut first = true;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if first {
            first = false;
            continue;
        }
        if line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(())
}

/// `MOCK_OPENAI_DELAY_MS`: hold each answer this long (a model's latency;
/// bench/queue.sh's scaling run).
fn delay() -> std::time::Duration {
    let ms = std::env::var("MOCK_OPENAI_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    std::time::Duration::from_millis(ms)
}

fn serve(stream: TcpStream) {
    let hold = delay();
    let mut writer = stream.try_clone().expect("clone");
    let mut reader = BufReader::new(stream);
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{ANSWER}",
        ANSWER.len()
    );
    while read_request(&mut reader).is_some() {
        if !hold.is_zero() {
            std::thread::sleep(hold);
        }
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

fn load(n: usize, threads: usize, url: &str) {
    let address = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let body = r#"{"model":"mock-1","messages":[{"role":"user","content":"ping"}]}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let left = Arc::new(AtomicUsize::new(n));
    let began = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (left, request, address) = (Arc::clone(&left), request.clone(), address.clone());
            std::thread::spawn(move || {
                let stream = TcpStream::connect(&address).expect("connect");
                let mut writer = stream.try_clone().expect("clone");
                let mut reader = BufReader::new(stream);
                while left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| l.checked_sub(1))
                    .is_ok()
                {
                    writer.write_all(request.as_bytes()).expect("send");
                    let mut length = 0usize;
                    loop {
                        let mut line = String::new();
                        reader.read_line(&mut line).expect("answer");
                        if line.trim().is_empty() {
                            break;
                        }
                        if let Some((name, value)) = line.split_once(':') {
                            if name.eq_ignore_ascii_case("content-length") {
                                length = value.trim().parse().expect("length");
                            }
                        }
                    }
                    let mut answer = vec![0; length];
                    reader.read_exact(&mut answer).expect("body");
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("worker");
    }
    let spent = began.elapsed().as_secs_f64();
    println!(
        "bare mock: {n} requests, {threads} threads: {spent:.2} s, {:.0} requests/s",
        n as f64 / spent
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--load") {
        load(
            args[2].parse().expect("N"),
            args[3].parse().expect("J"),
            &args[4],
        );
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    println!("{}", listener.local_addr().expect("addr").port());
    for stream in listener.incoming().flatten() {
        std::thread::spawn(move || serve(stream));
    }
}
