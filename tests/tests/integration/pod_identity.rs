//! The pod a runtime names in `CNI_ARGS`, through the plugin and the daemon: `list` (text and
//! JSON), `sandboxes` (and its `--pod` / `--verdict` filters), `why`, and the log lines of the
//! ADD, the verdict and the DEL, in text and in JSON.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use provisioner::dataplane::host_ifname;
use provisioner::pod::Pod;
use provisioner_tests::daemon_harness::{
    Daemon, conflist, plugin_stdin, run_plugin, run_plugin_with_args,
};
use provisioner_tests::daemon_queries::{
    allocations, container_of, cookie_of, inode_of, json_log, log_field, names_pod_in_fields,
    pod_of_view, verdict_and_intent, wait_views_of,
};
use provisioner_tests::{
    Netns, NetnsCookie, OwnRuntime, RuntimeNetns, netns_inode, runtime_runs_plugin, wait_until,
};
use serde_json::Value;

const PATIENCE: Duration = Duration::from_secs(30);

/// Pod `shop/<name>` of `uid`, its sandbox `sandbox_id`.
fn shop_pod(name: &str, uid: &str, sandbox_id: &str) -> Pod {
    Pod {
        namespace: "shop".to_owned(),
        name: name.to_owned(),
        uid: Some(uid.to_owned()),
        sandbox_id: Some(sandbox_id.to_owned()),
    }
}

/// What containerd passes a CNI plugin for a pod (measured: containerd 1.6).
fn kubelet_args(pod: &Pod) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
        pod.namespace,
        pod.name,
        pod.sandbox_id.as_deref().unwrap_or_default(),
        pod.uid.as_deref().unwrap_or_default()
    )
}

fn sandboxes_json(daemon: &Daemon, filter: &[&str]) -> Result<Vec<Value>> {
    let mut args = vec!["sandboxes", "--json"];
    args.extend_from_slice(filter);
    let out = daemon.cli(&args)?;
    if !out.status.success() {
        bail!(
            "sandboxes {filter:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let answer: Value = serde_json::from_slice(&out.stdout).context("sandboxes --json")?;
    Ok(answer["sandboxes"].as_array().cloned().unwrap_or_default())
}

/// ADD of sandbox `id` in `netns` for `pod`, named in `CNI_ARGS` as a kubelet's runtime names
/// it.
fn add_pod(id: &str, netns: &Path, pod: &Pod, stdin: &[u8]) -> Result<()> {
    plugin("ADD", id, Some(netns), Some(&kubelet_args(pod)), stdin)
}

fn plugin(
    command: &str,
    id: &str,
    netns: Option<&Path>,
    args: Option<&str>,
    stdin: &[u8],
) -> Result<()> {
    let out = match args {
        Some(args) => run_plugin_with_args(command, id, netns, args, stdin)?,
        None => run_plugin(command, id, netns, "eth0", stdin)?,
    };
    if out.code != 0 {
        bail!("{command} {id}: {out:?}");
    }
    Ok(())
}

#[test]
fn the_pod_named_in_cni_args_is_listed_filtered_explained_and_logged() -> Result<()> {
    let node = Netns::new("node")?;
    let mut daemon = Daemon::start_with_conflist(&node, &["--trace-deadline", "1"], |socket| {
        conflist("podid", "1.0.0", socket, "10.254.30.0/24", None)
    })?;
    let config = conflist("podid", "1.0.0", &daemon.socket, "10.254.30.0/24", None);
    let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.0.0"))?;
    daemon.wait_tracing(PATIENCE)?;

    let web_ns = Netns::new("podid")?;
    let plain_ns = Netns::new("podid")?;
    let sandbox_id = format!("4bf982a7{:056x}", web_ns.cookie()?);
    let web = shop_pod("web-0", "6f0c2b8e-4d7e-4c1b-9a51-0c2f3e4d5a6b", &sandbox_id);
    add_pod(&sandbox_id, web_ns.path(), &web, &stdin)?;
    // A runtime that names no pod (no Kubernetes): the sandbox is listed without one.
    plugin("ADD", "plain-1", Some(plain_ns.path()), None, &stdin)?;

    // list --json and list.
    let listed = allocations(&daemon)?;
    let web_entry = listed
        .iter()
        .find(|a| a.container_id == sandbox_id)
        .context("web-0's allocation listed")?;
    assert_eq!(web_entry.pod.as_ref(), Some(&web), "{listed:?}");
    let plain_entry = listed
        .iter()
        .find(|a| a.container_id == "plain-1")
        .context("plain-1 listed")?;
    assert_eq!(plain_entry.pod, None);
    let text = String::from_utf8_lossy(&daemon.cli(&["list"])?.stdout).into_owned();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("POD\tCONTAINER\tIFNAME\tADDRESSES"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with(&format!("shop/web-0\t{sandbox_id}\teth0\t10.254.30."))),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("-\tplain-1\teth0\t")),
        "{text}"
    );

    // sandboxes: both networked and confirmed, web-0's view naming its pod.
    let ours: HashSet<u64> = [web_ns.cookie()?, plain_ns.cookie()?].into();
    let views = wait_views_of(&daemon, &ours, true, PATIENCE)?;
    for view in &views {
        assert_eq!(verdict_and_intent(view), "networked+confirmed", "{view:#}");
    }
    let web_view = views
        .iter()
        .find(|v| cookie_of(v) == Some(web_ns.cookie().unwrap_or_default()))
        .context("web-0's view")?;
    assert_eq!(pod_of_view(web_view).as_ref(), Some(&web), "{web_view:#}");
    let plain_view = views
        .iter()
        .find(|v| cookie_of(v) == Some(plain_ns.cookie().unwrap_or_default()))
        .context("plain-1's view")?;
    assert_eq!(pod_of_view(plain_view), None, "{plain_view:#}");
    let text = String::from_utf8_lossy(&daemon.cli(&["sandboxes"])?.stdout).into_owned();
    assert!(
        text.lines().any(
            |l| l.starts_with(&format!("pod shop/web-0 container {sandbox_id}: "))
                && l.contains("INTENT CONFIRMED pod shop/web-0 (uid 6f0c2b8e-")
        ),
        "{text}"
    );

    // The filters are checked on skipped and networked sandboxes together below
    // (json_log_objects_name_the_pod_and_sandbox_filters_keep_only_what_matches).
    let bad = daemon.cli(&["sandboxes", "--verdict", "broken"])?;
    assert!(!bad.status.success(), "an unknown verdict is refused");

    // why.
    let why = daemon.cli(&["why", "shop/web-0"])?;
    let said = String::from_utf8_lossy(&why.stdout).into_owned();
    assert!(
        why.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&why.stderr)
    );
    assert!(
        said.starts_with(&format!(
            "pod shop/web-0 (uid 6f0c2b8e-4d7e-4c1b-9a51-0c2f3e4d5a6b, sandbox {}), named by its CNI call",
            &sandbox_id[..8]
        )),
        "{said}"
    );
    for wanted in [
        "verdict: NETWORKED",
        "INTENT CONFIRMED",
        "timeline:",
        "diagnosis: its network is set up",
    ] {
        assert!(said.contains(wanted), "{wanted:?} missing:\n{said}");
    }
    let unknown = daemon.cli(&["why", "shop/nope"])?;
    assert_eq!(unknown.status.code(), Some(2), "{unknown:?}");
    let complaint = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        complaint.contains("knows no sandbox of pod shop/nope"),
        "{complaint}"
    );

    // The log: the ADD line and the verdict line name the pod, in the message and as fields.
    let log = wait_until("web-0's verdict logged", PATIENCE, || {
        let log = daemon.log();
        Ok(log
            .lines()
            .any(|l| l.contains("VERDICT NETWORKED pod shop/web-0"))
            .then_some(log))
    })?;
    let add_line = log
        .lines()
        .find(|l| l.contains("ADD pod shop/web-0"))
        .with_context(|| format!("no ADD line naming the pod:\n{log}"))?;
    assert!(names_pod_in_fields(add_line, &web), "{add_line}");
    let verdict_line = log
        .lines()
        .find(|l| l.contains("VERDICT NETWORKED pod shop/web-0"))
        .context("the verdict line")?;
    assert!(names_pod_in_fields(verdict_line, &web), "{verdict_line}");
    assert_eq!(
        log_field(verdict_line, "verdict"),
        Some("networked"),
        "{verdict_line}"
    );
    assert!(
        log_field(verdict_line, "netns").is_some_and(|n| n.starts_with("net:[")),
        "{verdict_line}"
    );
    assert!(
        log_field(verdict_line, "reason").is_some(),
        "{verdict_line}"
    );
    eprintln!("provisioner why shop/web-0:\n{said}\nthe verdict's log line:\n{verdict_line}");

    // Restarted, the daemon's audit names the pod its store recorded: of a live sandbox, and of
    // one whose namespace went while the daemon was down.
    let mut gone_ns = Netns::new("podid")?;
    let gone = Pod {
        name: "gone-0".to_owned(),
        uid: Some("0d5e7a11-9c3b-4f0e-8a2d-6b1c5e9f4a30".to_owned()),
        sandbox_id: Some("gone-0-sandbox".to_owned()),
        ..web.clone()
    };
    add_pod("gone-0-sandbox", gone_ns.path(), &gone, &stdin)?;
    daemon.stop_status()?;
    gone_ns.delete()?;
    let gone_veth = host_ifname("gone-0-sandbox", "eth0");
    wait_until(
        &format!("{gone_veth} gone with its namespace"),
        PATIENCE,
        || Ok((!node.links()?.contains(&gone_veth)).then_some(())),
    )?;
    daemon.restart(&node, &["--trace-deadline", "1"])?;
    let web_cookie: HashSet<u64> = [web_ns.cookie()?].into();
    let audited = wait_until("web-0 audited after the restart", PATIENCE, || {
        let views = sandboxes_json(&daemon, &[])?;
        Ok(views.into_iter().find(|v| {
            cookie_of(v).is_some_and(|c| web_cookie.contains(&c))
                && v["intent"]["intent"]["origin"] == "audit"
        }))
    })
    .with_context(|| daemon.log())?;
    assert_eq!(pod_of_view(&audited).as_ref(), Some(&web), "{audited:#}");
    let why = daemon.cli(&["why", "web-0"])?;
    assert!(why.status.success(), "{why:?}");
    let answer: Value = serde_json::from_slice(
        &daemon
            .cli(&["sandboxes", "--json", "--pod", "shop/gone-0"])?
            .stdout,
    )?;
    let absent = answer["absent"].as_array().cloned().unwrap_or_default();
    assert_eq!(absent.len(), 1, "{answer:#}");
    assert_eq!(absent[0]["container_id"], "gone-0-sandbox", "{answer:#}");
    assert_eq!(
        serde_json::from_value::<Option<Pod>>(absent[0]["pod"].clone())?.as_ref(),
        Some(&gone)
    );
    let log = daemon.log();
    let released = log
        .lines()
        .find(|l| l.contains("sandbox of pod shop/gone-0") && l.contains("gone (no host veth)"))
        .with_context(|| format!("the release of gone-0 names no pod:\n{log}"))?;
    assert!(names_pod_in_fields(released, &gone), "{released}");
    let why = daemon.cli(&["why", "shop/gone-0"])?;
    let said = String::from_utf8_lossy(&why.stdout);
    assert!(why.status.success(), "{why:?}");
    assert!(
        said.contains("netns gone while the daemon was down"),
        "{said}"
    );

    // DEL without CNI_ARGS (a runtime after its restart): the pod its ADD recorded is named.
    plugin("DEL", &sandbox_id, Some(web_ns.path()), None, &stdin)?;
    let log = daemon.log();
    let del_line = log
        .lines()
        .find(|l| l.contains("DEL pod shop/web-0"))
        .with_context(|| format!("no DEL line naming the pod:\n{log}"))?;
    assert!(names_pod_in_fields(del_line, &web), "{del_line}");
    plugin("DEL", "plain-1", Some(plain_ns.path()), None, &stdin)?;
    Ok(())
}

/// A socket caller's pod fields are cleaned as the plugin cleans CNI_ARGS: a newline in a pod
/// name cannot start a forged log line, nor reach `list`.
#[test]
fn a_pod_name_cannot_forge_a_log_line() -> Result<()> {
    let node = Netns::new("node")?;
    let daemon = Daemon::start_with_conflist(&node, &["--no-trace"], |socket| {
        conflist("podforge", "1.0.0", socket, "10.254.31.0/24", None)
    })?;
    daemon.wait_ready(PATIENCE)?;
    let sandbox = Netns::new("podforge")?;
    let mut add = testkit::daemon::sandbox_request("add", "forge-1", sandbox.path());
    add["pod"] = serde_json::json!({
        "namespace": "shop",
        "name": "web-0\nERROR FORGED by the caller",
        "uid": "u\r-1",
    });
    daemon.request(&add)?;
    let log = daemon.log();
    assert!(
        !log.lines().any(|l| l.starts_with("ERROR FORGED")),
        "a forged line:\n{log}"
    );
    assert!(
        log.contains("ADD pod shop/web-0ERROR FORGED by the caller (uid u-1)"),
        "{log}"
    );
    let listed = allocations(&daemon)?;
    let pod = listed
        .iter()
        .find(|a| a.container_id == "forge-1")
        .and_then(|a| a.pod.as_ref())
        .context("forge-1's pod listed")?;
    assert_eq!(pod.name, "web-0ERROR FORGED by the caller");
    daemon.request(&testkit::daemon::sandbox_request(
        "del",
        "forge-1",
        sandbox.path(),
    ))?;
    Ok(())
}

/// Which of `views` are about what the test made: the container ids of its ADDs and the
/// namespaces its own runtime made (named by their pins).
fn ours_in(views: &[Value], containers: &[&str], made: &[&RuntimeNetns]) -> BTreeSet<String> {
    views
        .iter()
        .filter_map(|v| match container_of(v) {
            Some(c) if containers.contains(&c) => Some(c.to_owned()),
            _ => made
                .iter()
                .find(|ns| ns.is_view_of(v))
                .map(|ns| ns.name().to_owned()),
        })
        .collect()
}

/// What a log pipeline reads (`--log-format json`): a networked pod's ADD and its verdict, and
/// a skipped pod's verdict (the pod named by the environment of the plugin its runtime ran),
/// each one JSON object with the pod, its sandbox and namespace as fields. And the filters of
/// `sandboxes` on an answer that holds networked and skipped sandboxes, named and not: each
/// keeps exactly those that match. The node-wide watch may hold other sandboxes: the test
/// reads only its own (the container ids of its ADDs, the namespaces of a runtime of its own),
/// the log objects about them (by the daemon's cookies of them), and
/// its pods' names are its own.
#[test]
fn json_log_objects_name_the_pod_and_sandbox_filters_keep_only_what_matches() -> Result<()> {
    let node = Netns::new("node")?;
    let daemon = Daemon::start_with_conflist(
        &node,
        &["--trace-deadline", "1", "--log-format", "json"],
        |socket| conflist("podjson", "1.0.0", socket, "10.254.32.0/24", None),
    )?;
    let config = conflist("podjson", "1.0.0", &daemon.socket, "10.254.32.0/24", None);
    let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.0.0"))?;
    daemon.wait_tracing(PATIENCE)?;
    let tag = std::process::id();

    // Networked: web (named by its CNI call) and plain (no pod).
    let web_ns = Netns::new("podjs")?;
    let plain_ns = Netns::new("podjs")?;
    let web_id = format!("5ca1ab1e{tag:056x}");
    let web = shop_pod(
        &format!("web-{tag}"),
        &format!("0b9e2f6a-1c3d-4e5f-8a7b-{tag:012x}"),
        &web_id,
    );
    let plain_id = format!("plain-{tag}");
    add_pod(&web_id, web_ns.path(), &web, &stdin)?;
    plugin("ADD", &plain_id, Some(plain_ns.path()), None, &stdin)?;
    // Skipped: cart (its runtime ran only the loopback plugin, which names it) and one no
    // plugin ran for.
    let runtime = OwnRuntime::new()?;
    let cart_ns = RuntimeNetns::created_by(&runtime, "cni-pj")?;
    let bare_ns = RuntimeNetns::created_by(&runtime, "cni-pj")?;
    let cart_id = format!("ca27{tag:060x}");
    let cart = shop_pod(
        &format!("cart-{tag}"),
        &format!("7d1c3b5a-2e4f-4a6b-9c8d-{tag:012x}"),
        &cart_id,
    );
    let cart_netns = format!("/var/run/netns/{}", cart_ns.name());
    runtime_runs_plugin(
        "loopback",
        None,
        &[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", &cart_id),
            ("CNI_NETNS", &cart_netns),
            ("CNI_IFNAME", "lo"),
            ("CNI_ARGS", &kubelet_args(&cart)),
        ],
    )?;

    let containers = [web_id.as_str(), plain_id.as_str()];
    let made = [&cart_ns, &bare_ns];
    let everything = wait_until("a verdict on each of our sandboxes", PATIENCE, || {
        let views = sandboxes_json(&daemon, &[])?;
        let judged: Vec<Value> = views
            .iter()
            .filter(|v| !v["verdict"].is_null())
            .cloned()
            .collect();
        let intents_confirmed = views
            .iter()
            .filter(|v| container_of(v).is_some_and(|c| containers.contains(&c)))
            .all(|v| v["intent"]["status"] == "confirmed");
        Ok((ours_in(&judged, &containers, &made).len() == 4 && intents_confirmed).then_some(views))
    })
    .with_context(|| daemon.log())?;
    let verdict_of = |key: &str| -> Option<&str> {
        everything
            .iter()
            .find(|v| ours_in(std::slice::from_ref(v), &containers, &made).contains(key))
            .and_then(|v| v["verdict"]["verdict"].as_str())
    };
    let (cart_key, bare_key) = (cart_ns.name().to_owned(), bare_ns.name().to_owned());
    // The daemon's names of the two judged namespaces whose log objects are read: its cookie
    // (a JSON object's `netns_cookie`) and the inode its `netns` field shows.
    let named_by_daemon = |key: &str| -> Result<(u64, u64)> {
        let view = everything
            .iter()
            .find(|v| ours_in(std::slice::from_ref(v), &containers, &made).contains(key))
            .with_context(|| format!("no view of {key}"))?;
        Ok((
            cookie_of(view).with_context(|| format!("no cookie: {view:#}"))?,
            inode_of(view).with_context(|| format!("no inode: {view:#}"))?,
        ))
    };
    let (web_cookie, web_inode) = named_by_daemon(&web_id)?;
    let (cart_cookie, cart_inode) = named_by_daemon(&cart_key)?;
    assert_eq!(web_inode, netns_inode(web_ns.path())?);
    assert_eq!(cart_inode, cart_ns.inode());
    assert_eq!(verdict_of(&web_id), Some("networked"));
    assert_eq!(verdict_of(&plain_id), Some("networked"));
    assert_eq!(verdict_of(&cart_key), Some("skipped"));
    assert_eq!(verdict_of(&bare_key), Some("skipped"));

    // The filters, each on an answer that holds records it must keep and records it must not.
    let kept = |filter: &[&str]| -> Result<BTreeSet<String>> {
        let views = sandboxes_json(&daemon, filter)?;
        if let Some(kind) = filter
            .iter()
            .position(|f| *f == "--verdict")
            .and_then(|at| filter.get(at + 1))
        {
            assert!(
                views.iter().all(|v| v["verdict"]["verdict"] == *kind),
                "{filter:?} kept another verdict: {views:#?}"
            );
        }
        Ok(ours_in(&views, &containers, &made))
    };
    let set =
        |keys: &[&str]| -> BTreeSet<String> { keys.iter().map(|k| (*k).to_owned()).collect() };
    let web_name = web.qualified_name();
    let cart_name = cart.qualified_name();
    assert_eq!(kept(&[])?, set(&[&web_id, &plain_id, &cart_key, &bare_key]));
    assert_eq!(
        kept(&["--verdict", "skipped"])?,
        set(&[&cart_key, &bare_key])
    );
    assert_eq!(
        kept(&["--verdict", "networked"])?,
        set(&[&web_id, &plain_id])
    );
    assert_eq!(kept(&["--pod", &web_name])?, set(&[&web_id]));
    assert_eq!(kept(&["--pod", &web.name])?, set(&[&web_id]), "a bare name");
    assert_eq!(kept(&["--pod", &cart_name])?, set(&[&cart_key]));
    assert_eq!(
        kept(&["--pod", &cart_name, "--verdict", "skipped"])?,
        set(&[&cart_key])
    );
    assert!(kept(&["--pod", &web_name, "--verdict", "skipped"])?.is_empty());
    assert!(kept(&["--pod", &cart_name, "--verdict", "networked"])?.is_empty());
    // Another pod namespace, same name: no match.
    assert!(sandboxes_json(&daemon, &["--pod", &format!("other/{}", web.name)])?.is_empty());
    // The pod filter matches no view of another pod (of this test or another).
    for (name, key) in [(&web_name, &web_id), (&cart_name, &cart_key)] {
        let views = sandboxes_json(&daemon, &["--pod", name])?;
        assert_eq!(views.len(), 1, "{name}: {views:#?}");
        assert_eq!(
            ours_in(&views, &containers, &made),
            set(&[key.as_str()]),
            "{name}"
        );
    }

    // The JSON log: one object per line; exactly one per fact, field by field.
    let objects = wait_until("both verdicts logged", PATIENCE, || {
        let objects = json_log(&daemon.log())?;
        let logged = |cookie: u64| {
            objects
                .iter()
                .any(|o| o["netns_cookie"] == cookie && o["verdict"].is_string())
        };
        Ok((logged(web_cookie) && logged(cart_cookie)).then_some(objects))
    })
    .with_context(|| daemon.log())?;
    let only = |what: &str, wanted: &dyn Fn(&Value) -> bool| -> Result<Value> {
        let found: Vec<&Value> = objects.iter().filter(|o| wanted(o)).collect();
        match found[..] {
            [one] => Ok(one.clone()),
            _ => bail!("{} objects for {what}: {found:#?}", found.len()),
        }
    };
    let fields = |object: &Value, pod: &Pod| {
        for (key, value) in [
            ("pod_namespace", Some(pod.namespace.as_str())),
            ("pod_name", Some(pod.name.as_str())),
            ("pod_uid", pod.uid.as_deref()),
            ("sandbox_id", pod.sandbox_id.as_deref()),
        ] {
            assert_eq!(object[key].as_str(), value, "{key} of {object:#}");
        }
    };
    let message_has =
        |o: &Value, text: &str| o["message"].as_str().is_some_and(|m| m.contains(text));
    let add = only("web's ADD", &|o| {
        message_has(o, &format!("ADD pod {web_name} "))
    })?;
    fields(&add, &web);
    assert_eq!(add["level"], "INFO", "{add:#}");
    assert_eq!(add["container"], web_id.as_str(), "{add:#}");
    for (pod, cookie, inode, verdict, level) in [
        (&web, web_cookie, web_inode, "networked", "INFO"),
        (&cart, cart_cookie, cart_inode, "skipped", "WARN"),
    ] {
        let netns = format!("net:[{inode}]");
        let object = only(&format!("{}'s verdict", pod.name), &|o| {
            o["netns_cookie"] == cookie && o["verdict"].is_string()
        })?;
        fields(&object, pod);
        assert_eq!(object["netns"], netns.as_str(), "{object:#}");
        assert_eq!(object["verdict"], verdict, "{object:#}");
        assert_eq!(object["level"], level, "{object:#}");
        assert!(
            object["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{object:#}"
        );
        assert!(
            message_has(
                &object,
                &format!(
                    "VERDICT {} pod {}",
                    verdict.to_uppercase(),
                    pod.qualified_name()
                )
            ),
            "{object:#}"
        );
    }

    plugin("DEL", &web_id, Some(web_ns.path()), None, &stdin)?;
    plugin("DEL", &plain_id, Some(plain_ns.path()), None, &stdin)?;
    Ok(())
}
