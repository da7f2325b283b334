//! Links the system ISA-L (Debian: libisal-dev). Honours ISAL_LIB_DIR for non-standard installs.
fn main() {
    println!("cargo:rerun-if-env-changed=ISAL_LIB_DIR");
    if let Ok(dir) = std::env::var("ISAL_LIB_DIR") {
        println!("cargo:rustc-link-search=native={dir}");
    }
    println!("cargo:rustc-link-lib=isal");
}
