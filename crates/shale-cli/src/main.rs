//! The `shale` binary.
fn main() {
    println!("shale: under construction");
}
