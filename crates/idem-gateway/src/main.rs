//! The `idem` binary.

fn main() {
    eprintln!("idem: the gateway is not built yet");
    std::process::exit(2);
}
