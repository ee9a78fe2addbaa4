//! A TCP proxy on loopback that stands in for a managed Redis's moving
//! name (ElastiCache's primary endpoint, Memorystore's, Azure Cache's): a
//! connection made to it is piped to the server it points at when the
//! connection is made, and stays piped there; [`Proxy::point_at`] sends the
//! connections made after it to another server, as a DNS name that moves to
//! the new primary does. Its threads end when it is dropped.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// The proxy.
pub struct Proxy {
    port: u16,
    target: Arc<AtomicU16>,
    stop: Arc<AtomicBool>,
    /// Both ends of every connection piped, to cut them all on drop.
    open: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<JoinHandle<()>>,
}

impl Proxy {
    /// A proxy on a free loopback port, piping to `127.0.0.1:target`.
    pub fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("addr").port();
        let target = Arc::new(AtomicU16::new(target));
        let stop = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let accept = {
            let (target, stop, open) = (target.clone(), stop.clone(), open.clone());
            std::thread::spawn(move || {
                for client in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    let to = target.load(Ordering::SeqCst);
                    let Ok(server) = TcpStream::connect(("127.0.0.1", to)) else {
                        continue; // the client sees the connection closed
                    };
                    pipe(client, server, &open);
                }
            })
        };
        Proxy {
            port,
            target,
            stop,
            open,
            accept: Some(accept),
        }
    }

    /// `redis://127.0.0.1:PORT/0`: the "name" the daemon is given.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Connections made from now on go to `127.0.0.1:target`; those made
    /// before stay where they are.
    pub fn point_at(&self, target: u16) {
        self.target.store(target, Ordering::SeqCst);
    }
}

/// Copies each way on a thread of its own until either side closes.
fn pipe(client: TcpStream, server: TcpStream, open: &Mutex<Vec<TcpStream>>) {
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    if let (Ok(c3), Ok(s3)) = (client.try_clone(), server.try_clone()) {
        open.lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend([c3, s3]);
    }
    std::thread::spawn(move || copy(client, server));
    std::thread::spawn(move || copy(s2, c2));
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees the stop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for s in self
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}
