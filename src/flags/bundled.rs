//! The presets compiled into the binary: the repository's `presets/*.toml`, so an installed
//! `mxtune` (`cargo install --path .`) has them in any directory. User presets and
//! `--presets-dir` add to them and replace them by name (see [`super::preset::PresetStore`]).

macro_rules! bundled {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../../presets/", $name, ".toml")))),*]
    };
}

/// `(name, TOML text)` of every file in the repository's `presets/` folder. The list is written
/// out rather than generated so the binary's contents are plain to read; a test fails when it
/// and the folder disagree, so a new preset file cannot be left out.
pub const BUNDLED: &[(&str, &str)] = bundled![
    "baseline",
    "eagle3-long",
    "eagle3-short",
    "eagle3-throughput",
    "engine-cpu-tiny",
    "engine-cuda-120b",
    "engine-cuda-120b-synthetic",
    "engine-cuda-20b",
    "engine-cuda-20b-synthetic",
    "engine-eager",
    "engine-fp8",
    "engine-gemv",
    "engine-grouped-128x128",
    "engine-grouped-64x128",
    "engine-kv-fp8",
    "engine-mxfp4-all",
    "engine-q8",
    "engine-sinks-off",
    "final",
    "test-a",
    "test-b",
    "test-c",
    "test-d",
    "test-e",
    "test-f",
    "upstream-baseline",
    "upstream-cutlass-bf16",
    "upstream-cutlass-mxfp8",
    "upstream-marlin",
    "upstream-trtllm",
    "upstream-trtllm-mxfp8",
];

/// The text of the bundled preset `name`, if there is one.
pub fn text(name: &str) -> Option<(&'static str, &'static str)> {
    BUNDLED.iter().copied().find(|(n, _)| *n == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_matches_the_presets_folder() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("presets");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        on_disk.sort();
        let listed: Vec<String> = BUNDLED.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(
            listed, on_disk,
            "src/flags/bundled.rs must list every presets/*.toml, sorted"
        );
        for (name, text) in BUNDLED {
            let file = std::fs::read_to_string(dir.join(format!("{name}.toml"))).unwrap();
            assert_eq!(*text, file, "{name}: rebuild to pick up the file");
        }
    }
}
