//! The byte streams a connection runs over: TCP or unix sockets, optionally
//! wrapped in TLS after `NBD_OPT_STARTTLS`. A transport splits into an
//! independent reader and writer for the transmission phase, plus a
//! [`Closer`] that any thread (or server shutdown) can use to end it.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// A connected socket.
#[derive(Debug)]
pub enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Socket {
    pub fn try_clone(&self) -> io::Result<Socket> {
        Ok(match self {
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
            Socket::Unix(s) => Socket::Unix(s.try_clone()?),
        })
    }

    pub fn shutdown(&self) {
        // Errors mean the socket is already gone, which is what we want.
        let _ = match self {
            Socket::Tcp(s) => s.shutdown(Shutdown::Both),
            Socket::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.set_read_timeout(t),
            Socket::Unix(s) => s.set_read_timeout(t),
        }
    }

    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.set_write_timeout(t),
            Socket::Unix(s) => s.set_write_timeout(t),
        }
    }

    pub fn peer(&self) -> String {
        match self {
            Socket::Tcp(s) => s
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "tcp:?".into()),
            Socket::Unix(_) => "unix".into(),
        }
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.read(buf),
            Socket::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.write(buf),
            Socket::Unix(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.write_vectored(bufs),
            Socket::Unix(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Ends a connection from any thread: shuts the socket down so blocked reads
/// and writes return.
#[derive(Debug)]
pub struct Closer {
    socket: Socket,
}

impl Closer {
    pub fn new(socket: &Socket) -> io::Result<Closer> {
        Ok(Closer {
            socket: socket.try_clone()?,
        })
    }

    pub fn close(&self) {
        self.socket.shutdown();
    }
}

/// A connection's stream, plain or TLS.
#[derive(Debug)]
pub enum Transport {
    Plain(Socket),
    #[cfg(feature = "tls")]
    Tls(super::tls::TlsStream),
}

pub type ReadHalf = Box<dyn Read + Send>;
pub type WriteHalf = Box<dyn Write + Send>;

impl Transport {
    pub fn socket(&self) -> &Socket {
        match self {
            Transport::Plain(s) => s,
            #[cfg(feature = "tls")]
            Transport::Tls(t) => t.socket(),
        }
    }

    /// Splits into a reader and a writer usable from two threads.
    pub fn split(self) -> io::Result<(ReadHalf, WriteHalf)> {
        match self {
            // The std streams themselves, not `Socket`: they read into uninitialised
            // buffers (`read_buf`), so a write payload is not zero-filled first.
            Transport::Plain(Socket::Tcp(s)) => {
                let w = s.try_clone()?;
                Ok((Box::new(s), Box::new(w)))
            }
            Transport::Plain(Socket::Unix(s)) => {
                let w = s.try_clone()?;
                Ok((Box::new(s), Box::new(w)))
            }
            #[cfg(feature = "tls")]
            Transport::Tls(t) => {
                let (r, w) = t.split()?;
                Ok((Box::new(r), Box::new(w)))
            }
        }
    }
}

impl Read for Transport {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.read(buf),
            #[cfg(feature = "tls")]
            Transport::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.write(buf),
            #[cfg(feature = "tls")]
            Transport::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Transport::Plain(s) => s.flush(),
            #[cfg(feature = "tls")]
            Transport::Tls(t) => t.flush(),
        }
    }
}
