fn main() -> anyhow::Result<()> {
    provisioner_cli::run()
}

mod provisioner_cli {
    pub fn run() -> anyhow::Result<()> {
        anyhow::bail!("not yet wired")
    }
}
