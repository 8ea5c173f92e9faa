"""fleethq-source: pack, stat, merge. Pure: no master, no database.

The SavewebHQ command lines (its README and operations.md: ``source pack
--input urls.txt --output sinavideo.jobs.jsonl.zst``, ``source pack
--identity-mode MODE``; ``source merge`` from its cmd/source) run verbatim
through the installed ``fleethq-source`` binary; the rest call ``main``.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys

import pytest

from workers.source import cli as source_cli
from workers.wire.source import SourceReader, write_source

# SavewebHQ's api/testdata/job-id-v1.json, copied so the test stands alone.
JOB_ID_VECTORS = [
    ("seed", "https://example.org/",
     "j1_92f50438a02ab171b6735678275a2f9db233d4c88e301a0243886c2679ce7070"),
    ("asset", "https://example.org/a.png",
     "j1_3415498e0d810218fb682c5192529b4ec15d74dfbaedf293c3b13d5d5c652998"),
    ("seed", "https://例子.测试/路径",
     "j1_6f244c2352df6cd3f399df55501a1b77c57f98b85a94a2193849f5532e766528"),
]
SOURCE = os.path.join(os.path.dirname(sys.executable), "fleethq-source")


def j1(value: str, job_type: str = "seed") -> str:
    """The v1 default id, written out here rather than taken from the code under test."""
    return "j1_" + hashlib.sha256(f"{job_type}\0{value}".encode()).hexdigest()


def run(capsys, *argv):
    code = source_cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def shell(command: str, cwd, stdin: bytes | None = None):
    """A SavewebHQ command line with ``source`` replaced by our binary."""
    return subprocess.run(command.replace("source ", f"{SOURCE} ", 1), shell=True, cwd=cwd,
                          input=stdin, capture_output=True, timeout=60)


def read_back(path, mode="external_id"):
    with open(path, "rb") as stream:
        return list(SourceReader(stream, mode))


# --- pack (S1) -------------------------------------------------------------------------

def test_readme_pack_command_line_gives_default_ids(tmp_path):
    (tmp_path / "urls.txt").write_text("https://example.org/\n\nhttps://例子.测试/路径\r\n",
                                       encoding="utf-8")
    done = shell("source pack --input urls.txt --output sinavideo.jobs.jsonl.zst", tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"jobs": 2, "output": "sinavideo.jobs.jsonl.zst"}
    jobs = read_back(tmp_path / "sinavideo.jobs.jsonl.zst")
    assert [(j["type"], j["value"], j["id"]) for j in jobs] == [JOB_ID_VECTORS[0],
                                                                JOB_ID_VECTORS[2]]

    # Run again: the output exists, so it is refused and left as it was.
    before = (tmp_path / "sinavideo.jobs.jsonl.zst").read_bytes()
    again = shell("source pack --input urls.txt --output sinavideo.jobs.jsonl.zst", tmp_path)
    assert again.returncode == 1 and b"exists" in again.stderr
    assert (tmp_path / "sinavideo.jobs.jsonl.zst").read_bytes() == before


@pytest.mark.parametrize("mode", ["unique_value", "none"])
def test_operations_pack_with_identity_mode_from_stdin(tmp_path, mode):
    done = shell(f"source pack --identity-mode {mode} --input - --output jobs.zst", tmp_path,
                 stdin=b"simple-value\nother\n")
    assert done.returncode == 0, done.stderr
    assert read_back(tmp_path / "jobs.zst", mode) == [{"value": "simple-value", "type": "seed"},
                                                      {"value": "other", "type": "seed"}]


def test_values_are_kept_exactly_and_so_are_their_ids(tmp_path, capsys):
    # Only the line ending goes: spaces, tabs and a line of spaces are values.
    values = tmp_path / "values.txt"
    values.write_bytes(b"https://example.org/\n  padded value \r\n\tx\n   \n\n\r\n"
                       + "https://例子.测试/路径\n".encode())
    out = tmp_path / "jobs.zst"
    code, _, err = run(capsys, "pack", "--input", str(values), "--output", str(out))
    assert code == 0, err
    expected = ["https://example.org/", "  padded value ", "\tx", "   ", "https://例子.测试/路径"]
    jobs = read_back(out)
    assert [job["value"] for job in jobs] == expected
    assert [job["id"] for job in jobs] == [j1(value) for value in expected]
    assert jobs[0]["id"] == JOB_ID_VECTORS[0][2] and jobs[-1]["id"] == JOB_ID_VECTORS[2][2]


def test_jsonl_default_ids_match_the_job_id_vectors(tmp_path, capsys):
    jsonl = tmp_path / "jobs.jsonl"
    jsonl.write_text("".join(json.dumps({"value": value, "type": job_type}, ensure_ascii=False) + "\n"
                             for job_type, value, _ in JOB_ID_VECTORS), encoding="utf-8")
    out = tmp_path / "jobs.zst"
    code, _, err = run(capsys, "pack", "--jsonl", "--input", str(jsonl), "--output", str(out))
    assert code == 0, err
    assert [(job["type"], job["value"], job["id"]) for job in read_back(out)] == JOB_ID_VECTORS


def test_fleethq_spellings_still_work(tmp_path, capsys, monkeypatch):
    data = "".join(value + "\n" for job_type, value, _ in JOB_ID_VECTORS if job_type == "seed")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data.encode()), encoding="utf-8"))
    out = tmp_path / "stdin.zst"
    code, _, err = run(capsys, "pack", "--default-ids", "-o", str(out), "-")
    assert code == 0, err
    assert [job["id"] for job in read_back(out)] == [JOB_ID_VECTORS[0][2], JOB_ID_VECTORS[2][2]]
    # Inputs may follow options; --project-mode is --identity-mode.
    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / "b.txt").write_text("b\n")
    code, _, err = run(capsys, "pack", str(tmp_path / "a.txt"), "--project-mode", "none",
                       str(tmp_path / "b.txt"), "-o", str(tmp_path / "ab.zst"))
    assert code == 0, err
    assert [job["value"] for job in read_back(tmp_path / "ab.zst", "none")] == ["a", "b"]


def test_output_must_be_a_new_file(tmp_path, capsys):
    (tmp_path / "v.txt").write_text("x\n")
    assert run(capsys, "pack", "--input", str(tmp_path / "v.txt"), "--output", "-")[0] == 1
    assert run(capsys, "pack", "--input", str(tmp_path / "v.txt"))[0] == 1
    taken = tmp_path / "taken.zst"
    taken.write_bytes(b"keep me")
    code, _, err = run(capsys, "pack", "--input", str(tmp_path / "v.txt"), "--output", str(taken))
    assert code == 1 and "refusing to overwrite" in err
    assert taken.read_bytes() == b"keep me"


@pytest.mark.parametrize("bad_line, message", [
    ('{"value": "b", "bogus": 1}', "unknown field"),
    ('{"value": "b"', "not valid JSON"),
    ('{"value": "b", "random_key": 7}', "random_key"),  # enqueue only, never in source files
    ('{"value": NaN}', "not valid JSON"),
])
def test_bad_jsonl_line_exits_1_naming_the_line(tmp_path, capsys, bad_line, message):
    jsonl = tmp_path / "jobs.jsonl"
    jsonl.write_text('{"value": "a"}\n\n' + bad_line + '\n{"value": "c"}\n')
    out = tmp_path / "jobs.zst"

    code, _, err = run(capsys, "pack", "--jsonl", "--identity-mode", "none", "--input",
                       str(jsonl), "--output", str(out))
    assert code == 1
    assert "jobs.jsonl:3:" in err and message in err
    # No half-written output that could later pass for a complete file.
    assert [p.name for p in tmp_path.iterdir()] == ["jobs.jsonl"]


def test_pack_then_stat(tmp_path, capsys):
    (tmp_path / "v.txt").write_text("https://example.org/1\nhttps://example.org/2\n")
    out = tmp_path / "jobs.zst"
    assert run(capsys, "pack", "--input", str(tmp_path / "v.txt"), "--output", str(out))[0] == 0
    code, stdout, _ = run(capsys, "stat", str(out))
    assert code == 0
    stat = json.loads(stdout)
    assert stat["jobs"] == 2 and stat["uncompressed_bytes"] == len(zstd_plain(out)) > 0


def zstd_plain(path) -> bytes:
    import zstandard
    with open(path, "rb") as stream:
        return zstandard.ZstdDecompressor().stream_reader(stream).read()


def test_stat_rejects_a_file_that_is_not_zstd(tmp_path, capsys):
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"value": "a"}\n')
    code, _, err = run(capsys, "stat", str(plain))
    assert code == 1 and "zstd" in err


# --- merge (S2-S4) -----------------------------------------------------------------------

def source(path, specs):
    with open(path, "wb") as out:
        write_source(specs, out)
    return str(path)


def split(prefix, index):
    return f"{prefix}-{index:06d}.jobs.jsonl.zst"


def test_merge_dedupes_in_input_order_and_splits(tmp_path):
    via = "https://different-discovery.test/"
    source(tmp_path / "input-1.jobs.jsonl.zst", [
        {"id": "job-a", "value": "https://example.test/a", "type": "seed", "attr": {"stage": 2}},
        {"id": "job-b", "value": "https://example.test/b", "type": "asset"}])
    source(tmp_path / "input-2.jobs.jsonl.zst", [
        # Same id, type, value and attr; other via and hops: a duplicate, first one kept.
        {"id": "job-a", "value": "https://example.test/a", "type": "seed", "via": via, "hops": 9,
         "attr": {"stage": 2}},
        {"id": "job-c", "value": "https://example.test/c", "type": "seed", "via": via, "hops": 1}])
    done = shell("source merge --input input-1.jobs.jsonl.zst --input input-2.jobs.jsonl.zst "
                 "--output-prefix stage-2 --jobs-per-file 2", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"inputs=2 jobs=4 unique=3 duplicates=1 outputs=2\n"
    first, second = read_back(split(tmp_path / "stage-2", 1)), read_back(split(tmp_path / "stage-2", 2))
    assert [job["id"] for job in first + second] == ["job-a", "job-b", "job-c"]
    assert "via" not in first[0] and "hops" not in first[0]
    assert not os.path.exists(split(tmp_path / "stage-2", 3))


def test_merge_default_split_is_100000_jobs_per_file(tmp_path, capsys):
    source(tmp_path / "a.zst", [{"id": f"j{i}", "value": f"v{i}", "type": "seed"}
                                for i in range(100_001)])
    prefix = str(tmp_path / "out")
    code, out, err = run(capsys, "merge", "--input", str(tmp_path / "a.zst"),
                         "--output-prefix", prefix)
    assert code == 0, err
    assert out == "inputs=1 jobs=100001 unique=100001 duplicates=0 outputs=2\n"
    assert len(read_back(split(prefix, 1))) == 100_000 and len(read_back(split(prefix, 2))) == 1


def test_merge_conflict_on_type_value_or_attr_removes_every_output(tmp_path, capsys):
    a = source(tmp_path / "first.zst", [{"id": "other", "value": "o", "type": "seed"},
                                        {"id": "same-id", "value": "https://example.test/a",
                                         "type": "seed", "attr": {}}])
    for different in ({"value": "https://example.test/different"}, {"type": "asset"},
                      {"attr": {"k": 1}}):
        b = source(tmp_path / "second.zst", [{"id": "same-id", "value": "https://example.test/a",
                                              "type": "seed", **different}])
        prefix = str(tmp_path / "conflict")
        code, out, err = run(capsys, "merge", "--input", a, "--input", b, "--output-prefix",
                             prefix, "--jobs-per-file", "1")
        assert code == 1 and out == ""
        assert "second.zst:1:" in err and "identity_conflict" in err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["first.zst", "second.zst"]


def test_merge_never_overwrites_and_removes_its_earlier_split(tmp_path, capsys):
    a = source(tmp_path / "input.zst", [{"id": "job-a", "value": "a", "type": "seed"},
                                        {"id": "job-b", "value": "b", "type": "seed"}])
    prefix = str(tmp_path / "reserved")
    with open(split(prefix, 2), "w") as handle:
        handle.write("do not overwrite")
    code, _, err = run(capsys, "merge", "--input", a, "--output-prefix", prefix,
                       "--jobs-per-file", "1")
    assert code == 1 and "refusing to overwrite" in err
    assert not os.path.exists(split(prefix, 1))
    assert open(split(prefix, 2)).read() == "do not overwrite"


def test_merge_requires_ids_and_at_least_one_job(tmp_path, capsys):
    no_ids = source(tmp_path / "no-ids.zst", [{"value": "a", "type": "seed"}])
    code, _, err = run(capsys, "merge", "--input", no_ids, "--output", str(tmp_path / "m.zst"))
    assert code == 1 and "no-ids.zst:1:" in err and "id is required" in err
    empty = source(tmp_path / "empty.zst", [])
    code, _, err = run(capsys, "merge", "--input", empty, "--output-prefix", str(tmp_path / "e"))
    assert code == 1 and "no jobs" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.zst", "no-ids.zst"]


def test_merge_limits(tmp_path, capsys):
    a = source(tmp_path / "a.zst", [{"id": f"a{i}", "value": f"v{i}", "type": "seed"}
                                    for i in range(3)])
    b = source(tmp_path / "b.zst", [{"id": "a0", "value": "v0", "type": "seed"}])
    prefix = str(tmp_path / "m")
    # --max-jobs counts every input job, duplicates included: 4 here.
    code, _, err = run(capsys, "merge", "--input", a, "--input", b, "--output-prefix", prefix,
                       "--max-jobs", "3")
    assert code == 1 and "b.zst:1:" in err and "--max-jobs 3" in err
    assert not os.path.exists(split(prefix, 1))
    code, out, _ = run(capsys, "merge", "--input", a, "--input", b, "--output-prefix", prefix,
                       "--max-jobs", "4")
    assert code == 0 and out == "inputs=2 jobs=4 unique=3 duplicates=1 outputs=1\n"

    decoded = len(zstd_plain(a)) + len(zstd_plain(b))
    ok = str(tmp_path / "bytes-ok")
    assert run(capsys, "merge", "--input", a, "--input", b, "--output-prefix", ok,
               "--max-uncompressed-bytes", str(decoded))[0] == 0
    code, _, err = run(capsys, "merge", "--input", a, "--input", b, "--output-prefix",
                       str(tmp_path / "bytes-over"), "--max-uncompressed-bytes", str(decoded - 1))
    assert code == 1 and "--max-uncompressed-bytes" in err
    assert not os.path.exists(split(tmp_path / "bytes-over", 1))


@pytest.mark.parametrize("flags", [
    ["--max-jobs", "0"], ["--max-jobs", "100000001"],
    ["--max-uncompressed-bytes", "0"], ["--max-uncompressed-bytes", str(2**40 + 1)],
    ["--jobs-per-file", "0"], ["--max-jobs", "5", "--jobs-per-file", "6"],
    ["--output-prefix", "-"], ["--output", "x.zst"],         # one output form only
    ["--input", "-", "--input", "-"],                        # stdin once
])
def test_merge_bounds_are_usage_errors_exit_1(tmp_path, capsys, flags):
    a = source(tmp_path / "a.zst", [{"id": "a", "value": "a", "type": "seed"}])
    argv = ["merge", "--input", a, *flags]
    if "--output-prefix" not in flags:
        argv += ["--output-prefix", str(tmp_path / "p")]
    assert run(capsys, *argv)[0] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.zst"]


def test_merge_one_output_file_and_fleethq_modes(tmp_path, capsys):
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("u1\nu2\nu3\n")
    second.write_text("u3\nu4\nu1\n")
    for name in ("a", "b"):
        assert run(capsys, "pack", "-o", str(tmp_path / f"{name}.zst"),
                   str(tmp_path / f"{name}.txt"))[0] == 0
    merged = tmp_path / "merged.zst"
    code, stdout, err = run(capsys, "merge", "-o", str(merged), str(tmp_path / "a.zst"),
                            str(tmp_path / "b.zst"))
    assert code == 0, err
    assert stdout == "inputs=2 jobs=6 unique=4 duplicates=2 outputs=1\n"
    assert [job["value"] for job in read_back(merged)] == ["u1", "u2", "u3", "u4"]
    code, stdout, _ = run(capsys, "merge", "--no-dedupe", "-o", str(tmp_path / "all.zst"),
                          str(tmp_path / "a.zst"), str(tmp_path / "b.zst"))
    assert code == 0 and "unique=6" in stdout

    for name in ("a", "b"):
        assert run(capsys, "pack", "--identity-mode", "unique_value", "-o",
                   str(tmp_path / f"{name}-u.zst"), str(tmp_path / f"{name}.txt"))[0] == 0
    code, stdout, _ = run(capsys, "merge", "--project-mode", "unique_value", "-o",
                          str(tmp_path / "u.zst"), str(tmp_path / "a-u.zst"),
                          str(tmp_path / "b-u.zst"))
    assert code == 0 and "unique=4 duplicates=2" in stdout


def test_merge_reads_stdin_once(tmp_path):
    source(tmp_path / "a.zst", [{"id": "a", "value": "a", "type": "seed"}])
    b = source(tmp_path / "b.zst", [{"id": "b", "value": "b", "type": "seed"}])
    done = shell("source merge --input a.zst --input - --output-prefix m", tmp_path,
                 stdin=open(b, "rb").read())
    assert done.returncode == 0, done.stderr
    assert [job["id"] for job in read_back(split(tmp_path / "m", 1))] == ["a", "b"]


def test_usage_errors(tmp_path, capsys):
    assert run(capsys)[0] == 2
    # pack and merge exit 1 on every failure, as SavewebHQ's source tool does.
    assert run(capsys, "pack", "--identity-mode", "none", "--default-ids", "-o", "x")[0] == 1
    assert run(capsys, "merge", str(tmp_path / "a.zst"))[0] == 1  # no output
    assert run(capsys, "pack", "--bogus")[0] == 1
    assert run(capsys, "stat")[0] == 2
    assert not list(tmp_path.iterdir())


def test_cli_modules_do_not_import_the_master():
    code = ("import sys, workers.hqctl, workers.source.cli; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('app', 'flask')); "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("line", ["[" * 5000 + "]" * 5000, '{"value": "x", "hops": 1e400}',
                                  '{"value": NaN}'])
def test_a_jsonl_line_the_master_would_refuse_is_a_clear_error(tmp_path, capsys, line):
    """Nesting past the master's limit, non-finite numbers and NaN are refused
    on the line that holds them, with no traceback and no output file."""
    jsonl = tmp_path / "jobs.jsonl"
    jsonl.write_text('{"value": "ok"}\n' + line + "\n")
    out = tmp_path / "jobs.zst"
    code, _, err = run(capsys, "pack", "--jsonl", "--input", str(jsonl), "--output", str(out))
    assert code != 0 and f"{jsonl}:2:" in err, err
    assert "Traceback" not in err and not out.exists()
