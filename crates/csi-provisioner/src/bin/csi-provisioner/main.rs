//! The `csi-provisioner` sidecar: kubernetes-csi/external-provisioner's command line in
//! front of provision-controller.

mod flags;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let flags = flags::Flags::parse();
    if let Err(refused) = flags.refuse_unsupported() {
        eprintln!("csi-provisioner: {refused}");
        return std::process::ExitCode::from(2);
    }
    std::process::ExitCode::SUCCESS
}
