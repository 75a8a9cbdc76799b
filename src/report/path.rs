//! File names of the report and the trace: `%p` becomes the process id, `%r` the MPI rank (so
//! `mpirun -n 4 cuhook run --trace t.%r.jsonl` gives one file per rank), `%%` a single `%`.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

/// The variables launchers set to a process's rank, in the order they are trusted: the MPI
/// launchers' own first (Open MPI, PMIx, MPICH/Intel MPI's PMI, MVAPICH2), Slurm's task id
/// last, since `mpirun` inside a Slurm allocation may pass one `SLURM_PROCID` to all its ranks.
pub const RANK_VARIABLES: [&str; 5] = [
    "OMPI_COMM_WORLD_RANK",
    "PMIX_RANK",
    "PMI_RANK",
    "MV2_COMM_WORLD_RANK",
    "SLURM_PROCID",
];

/// This process's rank from the first of [`RANK_VARIABLES`] that holds a number; `0` outside a
/// launcher (a lone process is rank 0).
pub fn rank() -> String {
    RANK_VARIABLES
        .iter()
        .filter_map(std::env::var_os)
        .find(|v| !v.is_empty() && v.as_bytes().iter().all(u8::is_ascii_digit))
        .map(|v| v.to_string_lossy().into_owned())
        .unwrap_or_else(|| "0".to_owned())
}

/// Expand `%p` (this process's id), `%r` ([`rank`]) and `%%` in `path`.
pub fn expand_path(path: &OsStr) -> OsString {
    expand_path_for(path, std::process::id())
}

/// [`expand_path`] with `%p` standing for `pid` (the command `cuhook run` started).
///
/// ```
/// // Under `mpirun`, Open MPI tells each rank its number:
/// std::env::set_var("OMPI_COMM_WORLD_RANK", "3");
/// let name = cuhook::report::expand_path_for("t.%r.%p.jsonl".as_ref(), 4242);
/// assert_eq!(name, "t.3.4242.jsonl");
/// ```
pub fn expand_path_for(path: &OsStr, pid: u32) -> OsString {
    expand(path.as_bytes(), &pid.to_string(), &rank())
}

fn expand(path: &[u8], pid: &str, rank: &str) -> OsString {
    let mut out = Vec::with_capacity(path.len() + 8);
    let mut i = 0;
    while i < path.len() {
        let value: Option<&[u8]> = match (path[i], path.get(i + 1)) {
            (b'%', Some(b'p')) => Some(pid.as_bytes()),
            (b'%', Some(b'r')) => Some(rank.as_bytes()),
            (b'%', Some(b'%')) => Some(b"%"),
            _ => None,
        };
        match value {
            Some(v) => {
                out.extend_from_slice(v);
                i += 2;
            }
            None => {
                out.push(path[i]);
                i += 1;
            }
        }
    }
    OsString::from_vec(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_expand() {
        assert_eq!(expand(b"t.%r.%p.jsonl", "42", "3"), "t.3.42.jsonl");
        assert_eq!(expand(b"%%p-%q-%", "42", "3"), "%p-%q-%");
        assert_eq!(expand(b"plain.txt", "42", "3"), "plain.txt");
    }
}
