//! Compiles etcd's v3 protocol definitions (and cetera's peer service) in
//! this crate's `proto/` into Rust (messages via prost, services via tonic).
//! Uses the pure-Rust `protox` compiler, so no system `protoc` is needed.
//! pbjson writes the messages' JSON mapping (serde) for the HTTP gateway, as
//! etcd's grpc-gateway writes it: the protos' own field names, 64-bit
//! integers as strings, bytes as base64, enums by name, defaults left out.

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

    // The peer service is cetera's own and never crosses the gateway.
    pbjson_build::Builder::new()
        .register_descriptors(&compiler.encode_file_descriptor_set())?
        .preserve_proto_field_names()
        // etcd's gateway decodes a body with unknown fields, ignoring them.
        .ignore_unknown_fields()
        .build(&[
            ".mvccpb",
            ".authpb",
            ".etcdserverpb",
            ".v3lockpb",
            ".v3electionpb",
        ])?;
    Ok(())
}
