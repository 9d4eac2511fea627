//! packaging/: the systemd unit says what the daemon does (Type=notify, `shale
//! serve` with the example config's path) and the example config loads and serves.
//! `systemd-analyze verify` is not run here: CI machines need not have systemd.

mod daemon_common;

use std::path::PathBuf;

use daemon_common::{run, shale, Daemon, SMALL_DEVICES};
use shale_daemon::config::Config;

fn packaging(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../packaging")
        .join(file)
}

/// `(section, key, value)` of a unit file; comments and blank lines dropped.
fn unit_entries(text: &str) -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut entries = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not KEY=value: {line:?}"));
        assert!(!section.is_empty(), "{line:?} before any section");
        assert!(
            !v.ends_with('\\'),
            "continuation lines not expected: {line:?}"
        );
        entries.push((section.clone(), k.trim().to_string(), v.trim().to_string()));
    }
    entries
}

struct Unit(Vec<(String, String, String)>);

impl Unit {
    fn load() -> Unit {
        let text = std::fs::read_to_string(packaging("shale.service")).expect("read unit");
        Unit(unit_entries(&text))
    }

    fn all(&self, section: &str, key: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(s, k, _)| s == section && k == key)
            .map(|(_, _, v)| v.as_str())
            .collect()
    }

    /// The one value of a key that must appear once.
    fn one(&self, section: &str, key: &str) -> &str {
        match self.all(section, key)[..] {
            [v] => v,
            ref vs => panic!("[{section}] {key}: expected one value, got {vs:?}"),
        }
    }
}

#[test]
fn unit_is_a_notify_service_running_shale_serve() {
    let unit = Unit::load();
    assert_eq!(unit.one("Service", "Type"), "notify");
    assert_eq!(unit.one("Service", "NotifyAccess"), "main");
    let exec: Vec<&str> = unit
        .one("Service", "ExecStart")
        .split_whitespace()
        .collect();
    assert!(
        exec.first().is_some_and(|p| p.ends_with("/shale")),
        "{exec:?}"
    );
    assert_eq!(exec.get(1..3), Some(&["serve", "--config"][..]), "{exec:?}");
    assert_eq!(exec.get(3), Some(&"/etc/shale/shale.toml"), "{exec:?}");
    assert_eq!(unit.one("Service", "Restart"), "on-failure");
    assert_eq!(unit.one("Service", "KillSignal"), "SIGTERM");
    for key in ["RestartSec", "TimeoutStartSec", "TimeoutStopSec"] {
        unit.one("Service", key);
    }
    // The daemon reads its config once; systemctl reload must not pretend otherwise.
    assert!(unit.all("Service", "ExecReload").is_empty());
    assert_eq!(unit.one("Install", "WantedBy"), "multi-user.target");

    // The example config's data directory is the one place the unit lets it write.
    let config = Config::load(&packaging("shale.toml")).expect("example config");
    let data_dir = config.data_dir.to_string_lossy().into_owned();
    assert_eq!(unit.one("Service", "ProtectSystem"), "strict");
    assert!(
        unit.all("Service", "ReadWritePaths")
            .iter()
            .any(|v| v.split_whitespace().any(|p| p == data_dir)),
        "ReadWritePaths lacks {data_dir}"
    );
    assert_eq!(
        format!("/var/lib/{}", unit.one("Service", "StateDirectory")),
        data_dir
    );
    // The hand-off store is the unit's runtime directory, kept when the unit stops or
    // fails: a daemon killed and restarted finds it.
    assert_eq!(
        format!("/run/{}", unit.one("Service", "RuntimeDirectory")),
        config.engine.handoff_dir
    );
    assert_eq!(unit.one("Service", "RuntimeDirectoryPreserve"), "yes");
}

#[test]
fn example_config_loads_and_serves_on_a_unix_socket_only() {
    let path = packaging("shale.toml");
    let config = Config::load(&path).expect("example config");
    config.validate().expect("valid");
    assert_eq!(config.data_dir, PathBuf::from("/var/lib/shale"));
    assert_eq!(config.nbd.tcp, "", "TCP must be off");
    assert_eq!(
        config.expand(&config.nbd.unix_socket),
        Some(PathBuf::from("/var/lib/shale/nbd.sock"))
    );
    assert_eq!(
        config.expand(&config.admin.socket),
        Some(PathBuf::from("/var/lib/shale/admin.sock"))
    );

    // The binary takes it, and prints back the same configuration.
    let out = run(shale()
        .args(["serve", "--config"])
        .arg(&path)
        .arg("--print-config"));
    let printed = Config::from_toml(&String::from_utf8_lossy(&out.stdout), &path)
        .expect("printed config parses");
    assert_eq!(printed, config);

    // And serves with it (the data directory moved to a temp one; {data_dir} paths
    // follow): NBD on the unix socket, nothing on TCP.
    let mut args = vec!["--config".to_string(), path.to_string_lossy().into_owned()];
    args.extend(SMALL_DEVICES.iter().map(|s| s.to_string()));
    let mut d = Daemon::start_with(args);
    assert!(d.socket().exists(), "{}", d.log());
    assert!(!d.log().contains("serving NBD on TCP"), "{}", d.log());
    assert!(d.admin(&["volume", "list"]).contains("default"));
    d.stop();
}
