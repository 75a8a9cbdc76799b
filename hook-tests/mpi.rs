//! `cuhook run` under an MPI launcher: `%r` in --report and --trace names the rank from the
//! launcher's variables, `%p` the process id. Ranks are simulated by the variables each launcher
//! sets, and run once under a real `mpirun` (Debian's Open MPI).

mod common;

use std::path::Path;
use std::process::Child;

/// Every launcher variable cleared, then `vars` set: what one rank's environment holds.
fn rank_process(dir: &Path, vars: &[(&str, &str)], program: &str) -> Child {
    let mut cmd = common::cuhook_command();
    for v in cuhook::report::RANK_VARIABLES {
        cmd.env_remove(v);
    }
    cmd.envs(vars.iter().copied())
        .current_dir(dir)
        .args(["run", "--report", "r.%r.txt", "--trace", "t.%r.jsonl", "--"])
        .arg(common::fixtures_dir().join(program))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start cuhook run")
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn each_rank_writes_its_own_report_and_trace() {
    let dir = common::scratch_dir("mpi-ranks");
    // Four ranks at once, each told its rank the way one launcher does; rank 3 also carries
    // the SLURM_PROCID=0 that `mpirun` inside a Slurm allocation leaves to every rank.
    let ranks: [&[(&str, &str)]; 4] = [
        &[("OMPI_COMM_WORLD_RANK", "0")],
        &[("PMIX_RANK", "1")],
        &[("PMI_RANK", "2")],
        &[("OMPI_COMM_WORLD_RANK", "3"), ("SLURM_PROCID", "0")],
    ];
    let children: Vec<Child> = ranks
        .iter()
        .enumerate()
        .map(|(i, vars)| {
            let program = if i % 2 == 0 {
                "demo_driver"
            } else {
                "demo_rt_shared"
            };
            rank_process(&dir, vars, program)
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    for rank in 0..4 {
        let report = read(&dir, &format!("r.{rank}.txt"));
        let trace = read(&dir, &format!("t.{rank}.jsonl"));
        let api = if rank % 2 == 0 {
            "cuMemAlloc_v2"
        } else {
            "cudaMalloc"
        };
        assert!(report.contains(api), "rank {rank} report:\n{report}");
        // One process per rank: every line of the trace is one of its events, none of another's.
        let lines: Vec<&str> = trace.lines().collect();
        assert!(lines.len() >= 4, "rank {rank} trace: {trace}");
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&format!("\"api\":\"{api}\""))),
            "rank {rank} trace: {trace}"
        );
        let other = if rank % 2 == 0 {
            "cudaMalloc"
        } else {
            "cuMemAlloc_v2"
        };
        assert!(
            !lines
                .iter()
                .any(|l| l.contains(&format!("\"api\":\"{other}\""))),
            "rank {rank} trace has another rank's events: {trace}"
        );
    }
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "r.0.txt",
            "r.1.txt",
            "r.2.txt",
            "r.3.txt",
            "t.0.jsonl",
            "t.1.jsonl",
            "t.2.jsonl",
            "t.3.jsonl"
        ]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn slurm_task_id_names_the_rank_when_nothing_else_does() {
    let dir = common::scratch_dir("mpi-slurm");
    let mut c = rank_process(&dir, &[("SLURM_PROCID", "5")], "demo_driver");
    assert!(c.wait().unwrap().success());
    assert!(read(&dir, "r.5.txt").contains("cuMemAlloc_v2"));
    assert!(dir.join("t.5.jsonl").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn percent_p_is_the_command_pid_in_both_files() {
    let dir = common::scratch_dir("mpi-pid");
    let program = common::fixtures_dir().join("demo_driver");
    // The shell records its pid, then becomes the program: the command's pid is that pid.
    common::output_ok(
        common::cuhook_command()
            .current_dir(&dir)
            .env("PMI_RANK", "7")
            .args([
                "run",
                "--report",
                "r.%r.%p.txt",
                "--trace",
                "t.%r.%p.jsonl",
                "--",
            ])
            .args(["sh", "-c", "echo $$ > pid; exec \"$0\""])
            .arg(&program),
    );
    let pid = read(&dir, "pid").trim().to_owned();
    assert!(read(&dir, &format!("r.7.{pid}.txt")).contains("cuMemAlloc_v2"));
    assert!(read(&dir, &format!("t.7.{pid}.jsonl")).contains("\"event\":\"alloc\""));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_a_launcher_the_rank_is_zero_and_garbage_is_ignored() {
    let dir = common::scratch_dir("mpi-none");
    // A non-numeric value (never a path piece) is skipped for the next variable.
    let mut c = rank_process(&dir, &[("OMPI_COMM_WORLD_RANK", "../x")], "demo_driver");
    assert!(c.wait().unwrap().success());
    assert!(read(&dir, "r.0.txt").contains("cuMemAlloc_v2"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn under_a_real_mpirun_each_rank_names_its_files() {
    let dir = common::scratch_dir("mpi-mpirun");
    let mut cmd = std::process::Command::new("mpirun");
    for v in cuhook::report::RANK_VARIABLES {
        cmd.env_remove(v);
    }
    // Root in CI containers, and more ranks than cores.
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-n", "3"])
        .arg(env!("CARGO_BIN_EXE_cuhook"))
        .args(["run", "--report", "r.%r.txt", "--trace", "t.%r.jsonl", "--"])
        .arg(common::fixtures_dir().join("demo_driver"))
        .current_dir(&dir)
        .env_remove("CUHOOK_DISABLE")
        .env_remove("LD_PRELOAD");
    // Needs Open MPI's mpirun (apt-get install openmpi-bin; .ci/run does).
    common::output_ok(&mut cmd);
    for rank in 0..3 {
        assert!(read(&dir, &format!("r.{rank}.txt")).contains("cuMemAlloc_v2"));
        assert!(read(&dir, &format!("t.{rank}.jsonl")).contains("\"api\":\"cuMemAlloc_v2\""));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
