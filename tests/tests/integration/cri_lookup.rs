//! The pod of a sandbox no CNI plugin ran for, asked of the real containerd over CRI: with an
//! empty conf dir, RunPodSandbox fails and leaves the sandbox's namespace pinned; the resolver,
//! given that namespace's path and containerd as its creator, finds containerd's socket from
//! its config and names the pod RunPodSandbox was called for; given the socket and no
//! creator, it names the runtime from the socket's own answer. Once containerd is gone it says
//! the socket did not answer, within its timeout.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use provisioner::pod::{NetnsCreator, Pod, PodName, PodSource};
use provisioner::runtime::CriResolver;
use provisioner::runtime::resolver::DEFAULT_TIMEOUT;
use provisioner_tests::Netns;
use provisioner_tests::containerd::{CniSetup, Containerd};
use provisioner_tests::cri::Cri;

/// RunPodSandbox `name`, which must fail for want of a network; the sandbox containerd kept
/// (its id) and its netns path.
fn failing_pod(containerd: &mut Containerd, name: &str) -> Result<(String, PathBuf)> {
    let config = Cri::pod_config(name, &containerd.log_dir);
    match containerd.cri().run_pod(&config) {
        Ok(pod) => bail!(
            "RunPodSandbox {name} succeeded ({}) without a network",
            pod.id
        ),
        Err(status) => assert!(
            status.message().contains("cni plugin not initialized"),
            "{name}: {status}"
        ),
    }
    let pods = containerd.cri().list_pods()?;
    let id = pods
        .iter()
        .find(|p| p.metadata.as_ref().is_some_and(|m| m.name == name))
        .map(|p| p.id.clone())
        .with_context(|| format!("containerd does not list {name}: {pods:?}"))?;
    let netns = containerd.cri().pod_netns(&id)?;
    assert!(netns.exists(), "{} of {name} is gone", netns.display());
    Ok((id, netns))
}

/// `/var/run/netns/cni-..` as `/run/netns/cni-..`: the kernel watch sees the pin's real path.
fn under_run(path: &Path) -> PathBuf {
    path.strip_prefix("/var/run")
        .map_or_else(|_| path.to_path_buf(), |rest| Path::new("/run").join(rest))
}

fn expected(name: &str, id: &str) -> PodName {
    PodName::Known {
        pod: Pod {
            namespace: "default".to_owned(),
            name: name.to_owned(),
            uid: Some(format!("uid-{name}")),
            sandbox_id: Some(id.to_owned()),
        },
        source: PodSource::Cri {
            runtime: "containerd".to_owned(),
        },
    }
}

#[test]
fn containerd_names_the_pod_of_a_sandbox_no_plugin_ran_for() -> Result<()> {
    let node = Netns::new("node")?;
    let conf_dir = tempfile::tempdir()?;
    let mut containerd = Containerd::start(&node, &CniSetup::reading(conf_dir.path()))?;
    let creator = NetnsCreator {
        pid: containerd.pid().context("containerd's pid")?,
        comm: "containerd".to_owned(),
    };
    let (first_id, first_netns) = failing_pod(&mut containerd, "lookup-0")?;
    let (second_id, second_netns) = failing_pod(&mut containerd, "lookup-1")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // The socket comes from containerd's config (named on its command line): it is not the
    // default one.
    let resolver = CriResolver::new(None);
    let ask = |paths: &[PathBuf]| rt.block_on(resolver.resolve(paths, Some(&creator)));

    // By path, /var/run spelled /run, after a path that is no namespace.
    let answer = ask(&[PathBuf::from("/run/netns/none"), under_run(&second_netns)]);
    assert_eq!(answer, expected("lookup-1", &second_id));
    assert_eq!(
        answer.to_string(),
        format!(
            "pod default/lookup-1 (uid uid-lookup-1, sandbox {})",
            &second_id[..8]
        )
    );
    // By the namespace file itself, under another name (device and inode).
    let alias_dir = tempfile::tempdir()?;
    let alias = alias_dir.path().join("alias");
    std::os::unix::fs::symlink(&first_netns, &alias)?;
    assert_eq!(ask(&[alias]), expected("lookup-0", &first_id));
    // A namespace containerd did not create for a sandbox.
    assert_eq!(
        ask(&[node.path().to_path_buf()]).to_string(),
        "pod unknown (no CNI plugin ran and containerd does not list the sandbox)"
    );
    // Its socket given (`--cri-socket`) and the creator not known: the runtime names itself
    // (CRI Version).
    let socket = containerd.socket.clone();
    let by_socket = CriResolver::new(Some(socket.clone()));
    assert_eq!(
        rt.block_on(by_socket.resolve(&[under_run(&second_netns)], None)),
        expected("lookup-1", &second_id)
    );

    containerd.shutdown()?;
    // containerd is gone: its socket is asked through the override, as `--cri-socket` does.
    let resolver = CriResolver::new(Some(socket.clone()));
    let started = Instant::now();
    let answer = rt.block_on(resolver.resolve(&[under_run(&first_netns)], Some(&creator)));
    let took = started.elapsed();
    assert_eq!(
        answer.to_string(),
        format!(
            "pod unknown (containerd's CRI socket {} did not answer)",
            socket.display()
        )
    );
    assert!(
        took <= DEFAULT_TIMEOUT + Duration::from_millis(500),
        "the lookup took {took:?}"
    );
    Ok(())
}
