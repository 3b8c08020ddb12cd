//! End-to-end tests of `mxtune presets …` through the real binary.

use mxtune::flags::preset::PresetStore;
use mxtune::flags::{RenderContext, docker_run_argv, render_with};
use mxtune::vocab::TargetKind;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const HOME: &str = "/home/op";

fn repo_presets() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("presets")
}

/// Runs the binary with a fixed HOME and no user presets directory.
fn mxtune(args: &[&str], presets: &Path) -> Output {
    let empty = tempfile::tempdir().unwrap();
    Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .args(["presets", "--presets-dir"])
        .arg(presets)
        .args(args)
        .env("HOME", HOME)
        .env("XDG_CONFIG_HOME", empty.path())
        .env_remove("MXTUNE_PRESETS_DIR")
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// What `sh` makes of a command line: each word NUL-terminated by printf.
fn sh_words(line: &str) -> Vec<String> {
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!("printf '%s\\0' {line}"))
        .output()
        .unwrap();
    assert!(o.status.success(), "sh failed on: {line}");
    let s = String::from_utf8(o.stdout).unwrap();
    s.split_terminator('\0').map(str::to_string).collect()
}

#[test]
fn list_shows_every_required_preset() {
    let o = mxtune(&["list"], &repo_presets());
    assert!(o.status.success());
    let out = stdout(&o);
    for name in [
        "baseline",
        "test-a",
        "test-b",
        "test-c",
        "test-d",
        "test-e",
        "test-f",
        "eagle3-short",
        "eagle3-long",
        "eagle3-throughput",
        "final",
        "engine-cpu-tiny",
        "engine-cuda-120b",
        "engine-cuda-20b",
    ] {
        assert!(
            out.lines()
                .any(|l| l.split_whitespace().next() == Some(name)),
            "{name} in\n{out}"
        );
    }
}

#[test]
fn show_as_commands_parse_back_to_the_same_argv() {
    let store = PresetStore::new(vec![repo_presets()]);
    let ctx = RenderContext {
        home: Some(HOME.into()),
        ..Default::default()
    };
    let mut docker_checked = 0;
    for entry in store.list().unwrap() {
        let p = store.load(&entry.name).unwrap();
        let (form, want) = match p.flags.target {
            TargetKind::Docker => {
                let spec = render_with(&p.flags, TargetKind::Docker, &ctx).unwrap();
                docker_checked += 1;
                ("docker-run", docker_run_argv(&spec).unwrap())
            }
            _ => (
                "engine",
                render_with(&p.flags, TargetKind::Engine, &ctx)
                    .unwrap()
                    .argv,
            ),
        };
        let o = mxtune(&["show", &entry.name, "--as", form], &repo_presets());
        assert!(
            o.status.success(),
            "{}: {}",
            entry.name,
            String::from_utf8_lossy(&o.stderr)
        );
        let line = stdout(&o);
        let line = line.trim_end();
        assert_eq!(shell_words::split(line).unwrap(), want, "{}", entry.name);
        assert_eq!(sh_words(line), want, "{} through sh", entry.name);
    }
    assert!(docker_checked >= 11);
}

#[test]
fn show_as_vllm_and_env_render_the_container_view() {
    let o = mxtune(&["show", "final", "--as", "vllm"], &repo_presets());
    assert!(o.status.success());
    let out = stdout(&o);
    let line = out.lines().find(|l| !l.starts_with('#')).unwrap();
    let words = sh_words(line);
    assert_eq!(words[0], "env");
    assert!(words.contains(&"VLLM_MXFP4_BACKEND=CUTLASS".to_string()));
    assert!(
        words
            .windows(2)
            .any(|w| w == ["--mxfp4-layers", "moe,qkv,o,lm_head"])
    );
    assert!(out.contains("/tmp/flashinfer_moe_tile containing 64x128"));

    let o = mxtune(&["show", "test-c", "--as", "env"], &repo_presets());
    let out = stdout(&o);
    assert!(out.contains("export VLLM_ATTENTION_SINKS=true"), "{out}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("VLLM_MXFP4_ACTIVATION is planned only"));
}

#[test]
fn check_passes_on_the_repository_presets() {
    let o = mxtune(&["check"], &repo_presets());
    assert!(o.status.success(), "{}", stdout(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("0 error(s)"));
}

#[test]
fn check_reports_file_and_line_and_fails_on_broken_presets() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let unknown = write(
        "unknown.toml",
        "description = \"x\"\n[axes]\nmoe_kernal = \"gemv\"\n",
    );
    let value = write("value.toml", "[axes]\nspeculative = \"medusa\"\n");
    let orphan = write("orphan.toml", "description = \"x\"\nextends = \"ghost\"\n");
    let loop_a = write("loop-a.toml", "extends = \"loop-b\"\n");
    write("loop-b.toml", "extends = \"loop-a\"\n");
    let conflict = write(
        "conflict.toml",
        "[axes]\nattention_backend = \"FLASHINFER\"\nattention_config = '{\"backend\": \"TRITON_ATTN\"}'\n",
    );
    let cases: [(&Path, String, &str); 5] = [
        (&unknown, format!("{}:3: ", unknown.display()), "moe_kernal"),
        (&value, format!("{}:2: ", value.display()), "eagle3-short"),
        (&orphan, format!("{}:2: ", orphan.display()), "ghost"),
        (&loop_a, "loop-b.toml:1: ".to_string(), "cycle"),
        (
            &conflict,
            format!("{}:2: ", conflict.display()),
            "attention-backend-and-config",
        ),
    ];
    for (file, prefix, needle) in cases {
        let o = mxtune(&["check", file.to_str().unwrap()], dir.path());
        let out = stdout(&o);
        assert!(
            !o.status.success(),
            "{} should fail:\n{out}",
            file.display()
        );
        let line = out
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle} in {out}"));
        assert!(line.contains(&prefix), "{line} should contain {prefix}");
    }
}

#[test]
fn check_refuses_what_the_engine_would_refuse_at_start() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text, needle) in [
        (
            "short",
            "extends = \"engine-cpu-tiny\"\n[serving]\nmax_model_len = 1\n",
            "--max-model-len 1 leaves no room",
        ),
        (
            "long",
            "extends = \"engine-cpu-tiny\"\n[serving]\nmax_model_len = 9999999\n",
            "exceeds the model's max_position_embeddings",
        ),
        (
            "tile",
            "extends = \"engine-cpu-tiny\"\n[axes]\ntile = \"64x128\"\n",
            "add --moe-kernel grouped",
        ),
        (
            "ghost",
            "extends = \"engine-cpu-tiny\"\n[engine]\nmodel = \"synthetic:gpt-oss-9b\"\n",
            "unknown synthetic model",
        ),
    ] {
        let file = dir.path().join(format!("{name}.toml"));
        std::fs::write(&file, text).unwrap();
        let o = mxtune(&["check", file.to_str().unwrap()], dir.path());
        let out = stdout(&o);
        assert!(!o.status.success(), "{name} should fail:\n{out}");
        let line = out
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{name}: no {needle:?} in\n{out}"));
        // The error points at the key in the file, names the rule and says the engine refuses.
        assert!(
            line.contains(&format!("{}:3: ", file.display()))
                && line.contains("engine-refuses")
                && line.contains("the bundled engine refuses this at start"),
            "{line}"
        );
    }
    // The default preset itself is accepted.
    let ok = dir.path().join("fine.toml");
    std::fs::write(
        &ok,
        "extends = \"engine-cpu-tiny\"\n[serving]\nmax_model_len = 2\n",
    )
    .unwrap();
    let o = mxtune(&["check", ok.to_str().unwrap()], dir.path());
    assert!(o.status.success(), "{}", stdout(&o));
}

#[test]
fn check_with_a_known_gpu_blocks_arch_errors() {
    let test_d = repo_presets().join("test-d.toml");
    let unknown = mxtune(&["check", test_d.to_str().unwrap()], &repo_presets());
    assert!(unknown.status.success(), "{}", stdout(&unknown));
    assert!(stdout(&unknown).contains("may apply"));
    let sm121 = mxtune(
        &["check", "--arch", "sm121", test_d.to_str().unwrap()],
        &repo_presets(),
    );
    assert!(!sm121.status.success());
    assert!(stdout(&sm121).contains("eagle3-cuda-graphs-sm121"));
}

#[test]
fn diff_lists_changed_keys() {
    let o = mxtune(&["diff", "baseline", "final"], &repo_presets());
    let out = stdout(&o);
    assert!(
        out.contains("axes.moe_backend: \"marlin\" → \"cutlass\""),
        "{out}"
    );
    assert!(out.contains("axes.tile: \"auto\" → \"64x128\""), "{out}");
    assert!(!out.contains("serving.port"), "{out}");
}

#[test]
fn presets_dir_comes_from_the_environment_too() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("only.toml"), "description = \"from env\"\n").unwrap();
    let empty = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .args(["presets", "list"])
        .env("MXTUNE_PRESETS_DIR", dir.path())
        .env("XDG_CONFIG_HOME", empty.path())
        .output()
        .unwrap();
    let out = stdout(&o);
    assert!(out.contains("only") && out.contains("from env"), "{out}");
}

#[test]
fn docs_subcommand_prints_the_committed_page() {
    let o = mxtune(&["docs"], &repo_presets());
    let committed =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/flags.md"))
            .unwrap();
    assert_eq!(stdout(&o), committed);
}

#[test]
fn show_as_json_is_the_rendered_launch_spec() {
    let o = mxtune(
        &["show", "engine-cpu-tiny", "--as", "json"],
        &repo_presets(),
    );
    assert!(o.status.success());
    let spec: mxtune::vocab::LaunchSpec = serde_json::from_slice(&o.stdout).unwrap();
    let store = PresetStore::new(vec![repo_presets()]);
    let p = store.load("engine-cpu-tiny").unwrap();
    let ctx = RenderContext {
        home: Some(HOME.into()),
        ..Default::default()
    };
    assert_eq!(
        spec,
        render_with(&p.flags, TargetKind::Engine, &ctx).unwrap()
    );
    assert!(
        spec.checks
            .iter()
            .any(|c| c.must_see == ["^kernel-path backend=cpu(?:\\s|$)"])
    );
}

/// Runs the binary from `cwd` as an installed copy would be: HOME is `home`, nothing else
/// names a presets directory.
fn installed(args: &[&str], cwd: &Path, home: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .args(args)
        .current_dir(cwd)
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("MXTUNE_PRESETS_DIR")
        .output()
        .unwrap()
}

/// The `presets list` line of `name`, split on runs of spaces: name, target, source, description.
fn list_row(out: &str, name: &str) -> Vec<String> {
    let line = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("{name} in\n{out}"));
    line.split("  ")
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn outside_the_repository_the_bundled_presets_are_there() {
    let (cwd, home) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let o = installed(&["presets", "list"], cwd.path(), home.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = stdout(&o);
    for name in ["baseline", "final", "engine-cpu-tiny"] {
        assert_eq!(list_row(&out, name)[2], "bundled", "{out}");
    }
    assert_eq!(
        out.lines().count(),
        std::fs::read_dir(repo_presets()).unwrap().count(),
        "every file of presets/, nothing hidden:\n{out}"
    );
    let o = installed(
        &["presets", "show", "final", "--as", "docker-run"],
        cwd.path(),
        home.path(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = installed(&["presets", "check"], cwd.path(), home.path());
    assert!(o.status.success(), "{}", stdout(&o));
}

#[test]
fn user_and_dir_presets_replace_bundled_ones_by_name_and_say_so() {
    let (cwd, home) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let user = home.path().join(".config/mxtune/presets");
    std::fs::create_dir_all(&user).unwrap();
    // Adjusts the bundled baseline (extends its own name), and so every bundled child of it.
    std::fs::write(
        user.join("baseline.toml"),
        "description = \"my baseline\"\nextends = \"baseline\"\n[serving]\nmax_num_seqs = 1\n",
    )
    .unwrap();
    std::fs::write(
        user.join("mine.toml"),
        "description = \"my own\"\nextends = \"final\"\n",
    )
    .unwrap();
    let o = installed(&["presets", "list"], cwd.path(), home.path());
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    assert_eq!(
        list_row(&out, "baseline")[2..],
        ["user", "my baseline"],
        "{out}"
    );
    assert_eq!(list_row(&out, "mine")[2], "user", "{out}");
    assert!(
        out.contains("(hides bundled:presets/baseline.toml)"),
        "{out}"
    );
    let o = installed(&["presets", "show", "mine"], cwd.path(), home.path());
    let out = stdout(&o);
    assert!(
        out.contains("mine (user) → final (bundled) → baseline (user) → baseline (bundled)"),
        "{out}"
    );
    assert!(out.contains("max_num_seqs = 1"), "{out}");

    // --presets-dir comes before the user directory; its label is the directory.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("baseline.toml"),
        "description = \"dir one\"\n",
    )
    .unwrap();
    let o = installed(
        &[
            "presets",
            "--presets-dir",
            dir.path().to_str().unwrap(),
            "list",
        ],
        cwd.path(),
        home.path(),
    );
    let out = stdout(&o);
    assert_eq!(
        list_row(&out, "baseline")[2..],
        [dir.path().display().to_string(), "dir one".to_string()],
        "{out}"
    );
    assert!(
        out.contains(&format!("(hides {})", user.join("baseline.toml").display()))
            && out.contains("(hides bundled:presets/baseline.toml)"),
        "{out}"
    );
}

#[test]
fn recipe_import_saves_into_the_user_directory_and_export_never_replaces() {
    let (cwd, home) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let out = cwd.path().join("baseline.yaml");
    let export = |out: &Path| {
        installed(
            &[
                "recipe",
                "export",
                "baseline",
                "--out",
                out.to_str().unwrap(),
            ],
            cwd.path(),
            home.path(),
        )
    };
    let o = export(&out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let first = std::fs::read_to_string(&out).unwrap();
    std::fs::write(&out, "# edited by hand\n").unwrap();
    let o = export(&out);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("exists"), "{err}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "# edited by hand\n");

    let recipe = cwd.path().join("r.yaml");
    std::fs::write(&recipe, first).unwrap();
    let import = |name: &str| {
        installed(
            &["recipe", "import", recipe.to_str().unwrap(), "--name", name],
            cwd.path(),
            home.path(),
        )
    };
    let o = import("from-recipe");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        home.path()
            .join(".config/mxtune/presets/from-recipe.toml")
            .is_file()
    );
    let o = installed(&["presets", "list"], cwd.path(), home.path());
    assert_eq!(list_row(&stdout(&o), "from-recipe")[2], "user");
    // A bundled name is not hidden without --overwrite.
    let o = import("baseline");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("bundled:presets/baseline.toml"),
        "{err}"
    );
    assert!(
        !home
            .path()
            .join(".config/mxtune/presets/baseline.toml")
            .exists()
    );
}

#[test]
fn a_docker_cluster_preset_shows_the_heads_vllm_serve_and_its_errors() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("tp2.toml"),
        "description = \"two nodes\"\ntarget = \"docker-cluster\"\n[cluster]\nhead = \"local\"\nworker = \"spark2\"\nparallel = \"pipeline\"\n[cluster.nccl]\nib_hca = \"rocep1s0f1\"\n",
    )
    .unwrap();
    let o = mxtune(&["show", "tp2", "--as", "vllm"], dir.path());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        out.contains("--pipeline-parallel-size 2 --distributed-executor-backend ray"),
        "{out}"
    );
    assert!(out.contains("NCCL_DEBUG=INFO"), "{out}");
    let o = mxtune(&["list"], dir.path());
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("docker-cluster"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );

    std::fs::write(
        dir.path().join("bad.toml"),
        "target = \"docker-cluster\"\n[cluster]\nhead = \"local\"\nworkr = \"spark2\"\n",
    )
    .unwrap();
    let o = mxtune(
        &["check", dir.path().join("bad.toml").to_str().unwrap()],
        dir.path(),
    );
    assert!(!o.status.success());
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("bad.toml:4: unknown field `workr`"), "{out}");
    std::fs::write(
        dir.path().join("bad.toml"),
        "target = \"docker-cluster\"\n[cluster]\nhead = \"local\"\n",
    )
    .unwrap();
    let o = mxtune(&["show", "bad", "--as", "vllm"], dir.path());
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cluster.worker is not set"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
