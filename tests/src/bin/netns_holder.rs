//! A process that moves itself into a new network namespace and holds it: the tests copy this
//! binary under a runtime's name (or a hostile one) to play a stranger that looks like a
//! runtime, e.g. `containerd 20 --config /dev/zero`. The first argument is how many seconds to
//! hold (default 30); the others are ignored (they are for whoever reads the command line). As
//! a user other than root, it makes a user namespace first, as an unprivileged process can.
//!
//! After the unshare it executes itself again, same name and arguments, as a runtime goes on
//! doing things: the kernel watch reports a namespace created by `unshare` at the task's next
//! traced step (here the exec), not while it only sleeps.

use std::os::unix::process::CommandExt;
use std::time::Duration;

use nix::sched::{CloneFlags, unshare};

/// Set for the second run, in the new namespace.
const HELD: &str = "NETNS_HOLDER_HELD";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if std::env::var_os(HELD).is_none() {
        let flags = if nix::unistd::geteuid().is_root() {
            CloneFlags::CLONE_NEWNET
        } else {
            CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET
        };
        if let Err(err) = unshare(flags) {
            eprintln!("netns_holder: unshare: {err}");
            std::process::exit(1);
        }
        // By its own path: the comm is taken from the file name an exec is given.
        let exe = std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into());
        let err = std::process::Command::new(exe)
            .arg0(args.first().map_or("netns_holder", String::as_str))
            .args(args.iter().skip(1))
            .env(HELD, "1")
            .exec();
        eprintln!("netns_holder: exec itself: {err}");
        std::process::exit(1);
    }
    let seconds = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(30);
    // Said once in its namespace: the test waits for this line.
    println!("holding");
    std::thread::sleep(Duration::from_secs(seconds));
}
