//! CNI result parsing (`prevResult`): whatever parses must print in every supported version's
//! shape, and the printed result must parse back (unchanged in the newest version).
#![no_main]

use libfuzzer_sys::fuzz_target;
use provisioner::cni::{CniResult, CniVersion};
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let Ok(result) = CniResult::from_json(&value) else {
        return;
    };
    for version in CniVersion::ALL {
        let printed = result.to_json(version);
        let back = CniResult::from_json(&printed)
            .unwrap_or_else(|e| panic!("{version} result {printed} does not parse back: {e}"));
        if version == CniVersion::LATEST {
            assert_eq!(back, result, "{version} result {printed}");
        }
    }
});
