//! A setup that fails after each of its steps in turn (a `setup.<step>.fail` failpoint) rolls
//! back everything it made, in the node and in the sandbox. The failpoints are process-wide, so
//! this test has its test binary to itself.

use anyhow::{Context, Result, ensure};
use provisioner::dataplane::{DataplaneError, SetupStep};
use provisioner::failpoint;
use provisioner_tests::Netns;
use provisioner_tests::dataplane_fixture::{assert_node_clean, assert_sandbox_clean, node, spec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_failure_after_each_step_rolls_back() -> Result<()> {
    let (node, dp) = node()?;
    for (i, step) in SetupStep::ALL.into_iter().enumerate() {
        let sb = Netns::new("fi")?;
        let s = spec(
            &format!("fi{i}"),
            &sb,
            &[
                ("10.244.7.2/24", "10.244.7.1"),
                ("fd00:7::2/64", "fd00:7::1"),
            ],
        );
        let point = format!("setup.{step}.fail");
        failpoint::arm(&point);
        let result = dp.setup(&s).await;
        failpoint::disarm(&point);
        let err = result.expect_err("injected failure");
        ensure!(err.setup_step() == Some(step), "{err}");
        ensure!(err.to_string().contains(&step.to_string()), "{err}");
        if let DataplaneError::Setup {
            rollback_errors, ..
        } = &err
        {
            ensure!(rollback_errors.is_empty(), "{err}");
        }
        assert_node_clean(&node).with_context(|| format!("after {step}"))?;
        assert_sandbox_clean(&sb).with_context(|| format!("after {step}"))?;
    }
    Ok(())
}
