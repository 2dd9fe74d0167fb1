//! Compiles etcd's v3 protocol definitions (and cetera's peer service) in
//! this crate's `proto/` into Rust (messages via prost, services via tonic).
//! Uses the pure-Rust `protox` compiler, so no system `protoc` is needed.

const PROTOS: &[&str] = &[
    "mvccpb/kv.proto",
    "authpb/auth.proto",
    "etcdserverpb/rpc.proto",
    "v3lockpb/v3lock.proto",
    "v3electionpb/v3election.proto",
    "ceterapb/peer.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");

    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler.include_source_info(true).include_imports(true);
    compiler.open_files(PROTOS)?;

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
