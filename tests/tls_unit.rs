//! `transport::tls` without a broker: the acceptor and connectors built from
//! PEM files made with the openssl CLI (as tests/harness.py makes them),
//! then real handshakes over an in-memory duplex pipe. What is proved:
//! with `client_ca` a client without a certificate is refused in the
//! handshake and one with a signed certificate is accepted; relayed
//! connections present no client certificate unless `relay_client_cert`;
//! errors name the file that could not be used.

use std::path::{Path, PathBuf};
use std::process::Command;

use antidote::config::{ClientTls, ServerTls};
use antidote::transport::tls::{self, connector, relay_connector, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsAcceptor;

/// A fresh directory with ca.pem, server.pem/key (127.0.0.1, localhost)
/// and client.pem/key, all signed by the CA.
fn make_certs(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("antidote-tls-unit-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&d)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=tls-unit-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    std::fs::write(
        d.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext");
    std::fs::write(
        d.join("client.ext"),
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n\
         extendedKeyUsage=clientAuth\n",
    )
    .expect("ext");
    for (who, cn) in [("server", "localhost"), ("client", "tls-unit-client")] {
        let (key, csr, pem, ext) = (
            format!("{who}.key"),
            format!("{who}.csr"),
            format!("{who}.pem"),
            format!("{who}.ext"),
        );
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={cn}"),
        ]);
        run(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
            "-extfile",
            &ext,
        ]);
    }
    d
}

fn server(d: &Path, mtls: bool) -> TlsAcceptor {
    tls::server(&ServerTls {
        cert: d.join("server.pem"),
        key: d.join("server.key"),
        client_ca: mtls.then(|| d.join("ca.pem")),
    })
    .expect("acceptor")
    .acceptor()
}

fn client_cfg(d: &Path, with_cert: bool, relay_client_cert: bool) -> ClientTls {
    ClientTls {
        ca: d.join("ca.pem"),
        cert: with_cert.then(|| d.join("client.pem")),
        key: with_cert.then(|| d.join("client.key")),
        server_name: None,
        relay_client_cert,
    }
}

/// One handshake plus one byte each way; Err with the server's error text.
async fn handshake(acc: &TlsAcceptor, up: &Upstream) -> Result<(), String> {
    let (c, s) = tokio::io::duplex(64 * 1024);
    let name = up.server_name("127.0.0.1").map_err(|e| e.to_string())?;
    let srv = async {
        let mut t = acc.accept(s).await.map_err(|e| e.to_string())?;
        let mut b = [0u8; 1];
        t.read_exact(&mut b).await.map_err(|e| e.to_string())?;
        t.write_all(&b).await.map_err(|e| e.to_string())?;
        t.flush().await.map_err(|e| e.to_string())
    };
    let cli = async {
        let mut t = up
            .connector
            .connect(name, c)
            .await
            .map_err(|e| e.to_string())?;
        t.write_all(b"x").await.map_err(|e| e.to_string())?;
        t.flush().await.map_err(|e| e.to_string())?;
        let mut b = [0u8; 1];
        t.read_exact(&mut b).await.map_err(|e| e.to_string())
    };
    let (s, c) = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        tokio::join!(srv, cli)
    })
    .await
    .map_err(|_| "handshake timed out".to_string())?;
    s.map_err(|e| format!("server: {e}"))?;
    c.map(|_| ()).map_err(|e| format!("client: {e}"))
}

#[tokio::test]
async fn mtls_refuses_a_client_without_a_certificate_in_the_handshake_and_accepts_a_signed_one() {
    let d = make_certs("mtls");
    let acc = server(&d, true);
    let err = handshake(
        &acc,
        &connector(&client_cfg(&d, false, false)).expect("connector"),
    )
    .await
    .expect_err("a client without a certificate was served");
    assert!(
        err.contains("server:") && err.contains("no certificates"),
        "{err}"
    );
    handshake(
        &acc,
        &connector(&client_cfg(&d, true, false)).expect("connector"),
    )
    .await
    .expect("a signed client certificate was refused");
    // Without client_ca, a client without a certificate is served.
    handshake(
        &server(&d, false),
        &connector(&client_cfg(&d, false, false)).expect("connector"),
    )
    .await
    .expect("plain TLS refused a client");
}

#[tokio::test]
async fn relayed_connections_present_the_proxys_certificate_only_when_configured() {
    let d = make_certs("relay");
    let acc = server(&d, true);
    let cfg = client_cfg(&d, true, false);
    // The proxy's own connections present it...
    handshake(&acc, &connector(&cfg).expect("connector"))
        .await
        .expect("own connection");
    // ...relayed client connections do not, so an mTLS broker refuses them...
    let err = handshake(&acc, &relay_connector(&cfg).expect("relay connector"))
        .await
        .expect_err("a relayed connection presented the proxy's certificate");
    assert!(err.contains("no certificates"), "{err}");
    // ...unless relay_client_cert says so.
    handshake(
        &acc,
        &relay_connector(&client_cfg(&d, true, true)).expect("relay connector"),
    )
    .await
    .expect("relay_client_cert: true did not present the certificate");
}

#[test]
fn tls_errors_name_the_file_that_could_not_be_used() {
    let d = make_certs("errors");
    let missing = d.join("missing.key");
    let err = tls::server(&ServerTls {
        cert: d.join("server.pem"),
        key: missing.clone(),
        client_ca: None,
    })
    .err()
    .expect("a missing key was accepted")
    .to_string();
    assert!(err.contains(&missing.display().to_string()), "{err}");
    let empty = d.join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").expect("write");
    let err = connector(&ClientTls {
        ca: empty.clone(),
        ..client_cfg(&d, false, false)
    })
    .err()
    .expect("a CA file without certificates was accepted")
    .to_string();
    assert!(
        err.contains(&empty.display().to_string()) && err.contains("no PEM certificate"),
        "{err}"
    );
    let err = connector(&ClientTls {
        server_name: Some("bad name!".into()),
        ..client_cfg(&d, false, false)
    })
    .err()
    .expect("an invalid server_name was accepted")
    .to_string();
    assert!(err.contains("server_name"), "{err}");
}

#[test]
fn a_configured_server_name_overrides_the_host_connected_to() {
    let d = make_certs("name");
    let up = connector(&ClientTls {
        server_name: Some("kafka.internal".into()),
        ..client_cfg(&d, false, false)
    })
    .expect("connector");
    assert_eq!(
        format!("{:?}", up.server_name("127.0.0.1").expect("name")),
        format!("{:?}", rustls_name("kafka.internal"))
    );
    let plain = connector(&client_cfg(&d, false, false)).expect("connector");
    assert_eq!(
        format!("{:?}", plain.server_name("127.0.0.1").expect("name")),
        format!("{:?}", rustls_name("127.0.0.1"))
    );
}

fn rustls_name(s: &str) -> rustls::pki_types::ServerName<'static> {
    rustls::pki_types::ServerName::try_from(s.to_string()).expect("valid name")
}
