//! Entry point shared by the cargo-fuzz target (`fuzz/` at the repository root) and
//! the stable stand-in (`tests/fuzz_corpus.rs`), so both exercise the same code.

use std::path::Path;

use crate::config::Config;
use crate::serve::DeviceSpec;

/// A configuration file's bytes, as `shale serve --config` reads them: parsed, checked,
/// and turned into the device spec and engine configuration the daemon would use. A
/// file that validates must survive `--print-config`: its TOML parses back to the
/// same configuration.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(c) = Config::from_toml(&text, Path::new("fuzz.toml")) else {
        return;
    };
    if let Ok(Some(exposure)) = c.tcp_exposure() {
        let _ = exposure.warning();
    }
    if c.validate().is_err() {
        return;
    }
    let printed = c.to_toml();
    let back = Config::from_toml(&printed, Path::new("printed.toml"));
    match back {
        Ok(b) => assert_eq!(b, c, "--print-config output parses to another config"),
        Err(e) => panic!("--print-config output does not parse: {e}\n{printed}"),
    }
    let Ok(spec) = DeviceSpec::from_config(&c) else {
        panic!("a validated config has no device spec");
    };
    let _ = spec.engine_config();
}
