//! End to end, exposure: what `shale serve` lets other users reach
//! (docs/security.md). Whoever reads a device file reads every volume, so only the
//! data directory's owner may.

mod daemon_common;

use daemon_common::*;

/// Whoever reads a device file reads every volume, so the daemon creates the data
/// directory 0700 and the device files 0600, and warns about one others can read.
#[test]
fn the_data_directory_and_device_files_are_the_owners_only() {
    let mut d = Daemon::start();
    let data = d.data_dir();
    assert_eq!(mode(&data), 0o700, "data directory");
    for name in ["cache.img", "capacity.img"] {
        assert_eq!(mode(&data.join(name)), 0o600, "{name}");
    }
    assert!(
        !d.log().contains("accessible to other users"),
        "{}",
        d.log()
    );
    d.stop();

    // A device file others can read (made before files were created 0600) is
    // served, with a warning naming it.
    use std::os::unix::fs::PermissionsExt;
    let cache = data.join("cache.img");
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    d.spawn();
    let log = d.last_log();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("accessible to other users")
            && l.contains("cache.img")),
        "{log}"
    );
    d.stop();
}
