//! `drums images`, `drums pull`, `drums image import|rm` (docs/oci.md).
//!
//! Credentials are the client's, as `podman --remote` sends them: read here
//! from the user's auth.json or docker config and passed to drumsd with the
//! pull, never stored by it.

use std::io::{IsTerminal, Read, Write};
use std::path::Path;

use bytes::Bytes;
use drums_api::{Client, ImageList, ImageRef, PullEvent, PullRequest};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::{Method, Request};

use crate::exit::{self, Failure};
use crate::table;

pub async fn list(c: &Client, json: bool) -> Result<i32, Failure> {
    let l: ImageList = c.json(Method::GET, "/v1/images", None::<&()>).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&l).expect("serialize"));
        return Ok(exit::OK);
    }
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1 << 20) as f64);
    let rows: Vec<Vec<String>> = l
        .images
        .iter()
        .map(|i| {
            let (id, about) = match i.kind.as_str() {
                "oci" => (
                    short_id(i.id.as_deref().unwrap_or_default()),
                    format!("{} layers", i.layers),
                ),
                _ => (
                    "-".into(),
                    format!("{} ({}) {}", i.suite, i.variant, i.packages.join(" ")),
                ),
            };
            vec![
                i.name.clone(),
                i.kind.clone(),
                id,
                mib(i.size_bytes),
                mib(i.shared_bytes),
                about,
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(&["NAME", "KIND", "ID", "SIZE", "SHARED", "ABOUT"], &rows)
    );
    Ok(exit::OK)
}

/// A session's image as `ps` shows it: a drums image's name, an OCI
/// image's short id.
pub fn short_image(key: &str) -> String {
    if key.starts_with("sha256:") {
        short_id(key)
    } else {
        key.to_string()
    }
}

/// `sha256:0123456789ab…` → `0123456789ab`, as podman shows ids.
pub fn short_id(id: &str) -> String {
    id.strip_prefix("sha256:")
        .unwrap_or(id)
        .chars()
        .take(12)
        .collect()
}

pub async fn pull(
    c: &Client,
    reference: &str,
    insecure: bool,
    quiet: bool,
) -> Result<i32, Failure> {
    let registry = drums_oci::registry_of(reference);
    let creds = drums_oci::credentials_for(&registry)
        .map_err(|e| Failure::usage(format!("read credentials for {registry}: {e}")))?;
    let req = PullRequest {
        reference: reference.into(),
        insecure,
        username: creds.as_ref().map(|c| c.username.clone()),
        password: creds.map(|c| c.password),
    };
    let body = serde_json::to_vec(&req).expect("serialize");
    let http = Request::builder()
        .method(Method::POST)
        .uri("/v1/images/pull")
        .header("host", "drums")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(Bytes::from(body)))
        .expect("valid request");
    let resp = c.check(c.send(http).await?).await?;
    let ndjson = resp
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"application/x-ndjson"));
    if !ndjson {
        // Every layer was stored already: the answer is the image.
        let r: ImageRef = serde_json::from_slice(&c.read_body(resp).await?)
            .map_err(|e| Failure::new(exit::INTERNAL, format!("decode pull answer: {e}")))?;
        println!("{}", r.id.unwrap_or_default());
        return Ok(exit::OK);
    }
    let tty = !quiet && std::io::stderr().is_terminal();
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    let mut result = None;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| Failure::new(exit::INTERNAL, format!("read pull progress: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(n) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=n).collect();
            // A line this client does not know (a newer drumsd's event) is
            // skipped, as progress is.
            let Ok(ev) = serde_json::from_slice::<PullEvent>(&line) else {
                continue;
            };
            match ev {
                PullEvent::Done { .. } | PullEvent::Error { .. } => result = Some(ev),
                _ if quiet => {}
                ev => progress(&ev, tty),
            }
        }
    }
    if tty {
        eprintln!();
    }
    match result {
        Some(PullEvent::Done { id, .. }) => {
            println!("{id}");
            Ok(exit::OK)
        }
        Some(PullEvent::Error { message }) => Err(Failure::new(
            exit::INTERNAL,
            format!("pull {reference}: {message}"),
        )),
        _ => Err(Failure::new(
            exit::INTERNAL,
            format!("pull {reference}: drumsd ended the answer early"),
        )),
    }
}

/// One progress line; on a terminal, one line redrawn per layer.
fn progress(ev: &PullEvent, tty: bool) {
    let text = match ev {
        PullEvent::Resolved {
            reference,
            id,
            layers,
        } => format!("{reference} is {} ({layers} layers)", short_id(id)),
        PullEvent::Layer {
            index,
            digest,
            stored: true,
            ..
        } => format!("layer {index}: {} already stored", short_id(digest)),
        PullEvent::Layer {
            index,
            digest,
            done,
            total,
            ..
        } => format!(
            "layer {index}: {} {:.1}/{:.1} MiB",
            short_id(digest),
            *done as f64 / 1048576.0,
            *total as f64 / 1048576.0
        ),
        PullEvent::Applying { index } => format!("layer {index}: applying"),
        PullEvent::Done { .. } | PullEvent::Error { .. } => return,
    };
    if tty {
        eprint!("\r\x1b[2K{text}");
        let _ = std::io::stderr().flush();
    } else {
        eprintln!("{text}");
    }
}

/// An archive file as it is, or an OCI layout directory as an oci-archive
/// (a tar of the directory), streamed to drumsd.
pub async fn import(
    c: &Client,
    file: &Path,
    name: Option<&str>,
    json: bool,
) -> Result<i32, Failure> {
    let r = import_archive(c, file, name).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r).expect("serialize"));
    } else {
        println!("{}", r.id.unwrap_or_default());
    }
    Ok(exit::OK)
}

/// `drums image tag IMAGE NAME`.
pub async fn tag(c: &Client, image: &str, name: &str) -> Result<i32, Failure> {
    let r: ImageRef = c
        .json(
            Method::POST,
            &format!("/v1/images/{}/tag", enc_segment(image)),
            Some(&drums_api::TagImage { name: name.into() }),
        )
        .await?;
    println!("{}", r.id.unwrap_or_default());
    Ok(exit::OK)
}

/// Stream an archive (or an OCI layout directory) to drumsd's import,
/// named `name` if given; the stored image.
pub async fn import_archive(
    c: &Client,
    file: &Path,
    name: Option<&str>,
) -> Result<ImageRef, Failure> {
    let meta = std::fs::metadata(file).map_err(|e| {
        let code = if e.kind() == std::io::ErrorKind::NotFound {
            exit::NOT_FOUND
        } else {
            exit::INTERNAL
        };
        Failure::new(code, format!("import {}: {e}", file.display()))
    })?;
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(8);
    let path = file.to_owned();
    let is_dir = meta.is_dir();
    if is_dir && !path.join("oci-layout").is_file() {
        return Err(Failure::usage(format!(
            "{} is a directory without an oci-layout file: not an OCI image layout",
            path.display()
        )));
    }
    let reader = std::thread::spawn(move || {
        let mut w = ChannelWriter { tx: tx.clone() };
        let sent = if is_dir {
            let mut b = tar::Builder::new(&mut w);
            b.follow_symlinks(false);
            b.append_dir_all(".", &path).and_then(|_| b.finish())
        } else {
            std::fs::File::open(&path).and_then(|mut f| copy(&mut f, &mut w))
        };
        if let Err(e) = sent {
            let _ = tx.blocking_send(Err(e));
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|r| (r.map(Frame::data), rx))
    });
    let uri = match name {
        Some(n) => format!("/v1/images/import?name={}", enc_segment(n)),
        None => "/v1/images/import".to_owned(),
    };
    let req = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header("host", "drums")
        .header("content-type", "application/x-tar")
        .body(StreamBody::new(stream))
        .expect("valid request");
    let resp = c.check(c.send(req).await?).await;
    // The reader ends once its last frame is sent or once hyper drops the
    // body (drumsd answered early, a refusal, and closed the connection).
    // Either needs this runtime to poll the connection: a blocking join on
    // it (one thread) deadlocked when the refusal came before the archive
    // was read.
    let _ = tokio::task::spawn_blocking(move || reader.join()).await;
    serde_json::from_slice(&c.read_body(resp?).await?)
        .map_err(|e| Failure::new(exit::INTERNAL, format!("decode import answer: {e}")))
}

/// A reference as one path segment: its `/` and `:` encoded too.
pub(crate) fn enc_segment(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn copy(r: &mut impl Read, w: &mut impl Write) -> std::io::Result<()> {
    std::io::copy(r, w).map(|_| ())
}

/// A `Write` whose bytes become the request body's frames.
struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tx
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::BrokenPipe, "drumsd stopped reading")
            })?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub async fn rm(c: &Client, images: &[String]) -> Result<i32, Failure> {
    let mut code = exit::OK;
    for i in images {
        let uri = format!("/v1/images/{}", enc_segment(i));
        match c.json::<ImageRef>(Method::DELETE, &uri, None::<&()>).await {
            Ok(r) => match r.id {
                Some(id) => println!("Deleted: {id}"),
                None => println!("Untagged: {i}"),
            },
            Err(e) => {
                let f = Failure::from(e);
                eprintln!("drums: image rm {i}: {}", f.message);
                code = f.code;
            }
        }
    }
    Ok(code)
}
