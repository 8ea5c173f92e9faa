"""fleethq-source: pack, stat, merge. Pure: no master, no database."""
from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from workers import source_cli
from workers.source import SourceReader

# DESIGN §4.2 test vectors (testdata/job-id-v1.json), copied so the test stands alone.
JOB_ID_VECTORS = [
    ("seed", "https://example.org/",
     "j1_92f50438a02ab171b6735678275a2f9db233d4c88e301a0243886c2679ce7070"),
    ("asset", "https://example.org/a.png",
     "j1_3415498e0d810218fb682c5192529b4ec15d74dfbaedf293c3b13d5d5c652998"),
    ("seed", "https://例子.测试/路径",
     "j1_6f244c2352df6cd3f399df55501a1b77c57f98b85a94a2193849f5532e766528"),
]


def run(capsys, *argv):
    code = source_cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def read_back(path, mode="external_id"):
    with open(path, "rb") as stream:
        return list(SourceReader(stream, mode))


def test_pack_values_then_stat_and_read_back(tmp_path, capsys):
    values = tmp_path / "values.txt"
    values.write_text("https://example.org/1\n\n  https://example.org/2  \r\nhttps://例子.测试/3\n",
                      encoding="utf-8")
    out = tmp_path / "jobs.jsonl.zst"

    code, stdout, _ = run(capsys, "pack", "--project-mode", "unique_value", "-o", str(out),
                          str(values))
    assert code == 0
    assert json.loads(stdout)["jobs"] == 3

    code, stdout, _ = run(capsys, "stat", str(out))
    assert code == 0
    stat = json.loads(stdout)
    jobs = read_back(out, "unique_value")
    assert stat == {"jobs": 3, "uncompressed_bytes": stat["uncompressed_bytes"]}
    assert stat["uncompressed_bytes"] > 0
    # Blank lines are skipped and surrounding whitespace (and CR) dropped.
    assert jobs == [{"value": "https://example.org/1", "type": "seed"},
                    {"value": "https://example.org/2", "type": "seed"},
                    {"value": "https://例子.测试/3", "type": "seed"}]


def test_default_ids_match_the_job_id_vectors(tmp_path, capsys):
    jsonl = tmp_path / "jobs.jsonl"
    jsonl.write_text("".join(json.dumps({"value": value, "type": job_type}, ensure_ascii=False) + "\n"
                             for job_type, value, _ in JOB_ID_VECTORS), encoding="utf-8")
    out = tmp_path / "jobs.zst"

    code, _, err = run(capsys, "pack", "--jsonl", "--default-ids", "-o", str(out), str(jsonl))
    assert code == 0, err
    assert [(job["type"], job["value"], job["id"]) for job in read_back(out)] == JOB_ID_VECTORS


def test_default_ids_for_plain_values_from_stdin(tmp_path, capsys, monkeypatch):
    seeds = [(value, job_id) for job_type, value, job_id in JOB_ID_VECTORS if job_type == "seed"]
    data = "".join(value + "\n" for value, _ in seeds).encode("utf-8")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    out = tmp_path / "stdin.zst"

    code, _, err = run(capsys, "pack", "--default-ids", "-o", str(out), "-")
    assert code == 0, err
    assert [(job["value"], job["id"]) for job in read_back(out)] == seeds


def test_missing_id_in_external_id_mode_suggests_default_ids(tmp_path, capsys):
    values = tmp_path / "values.txt"
    values.write_text("https://example.org/\n")
    code, _, err = run(capsys, "pack", "-o", str(tmp_path / "x.zst"), str(values))
    assert code == 1
    assert "values.txt:1:" in err and "--default-ids" in err


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

    code, _, err = run(capsys, "pack", "--jsonl", "--project-mode", "none", "-o", str(out),
                       str(jsonl))
    assert code == 1
    assert "jobs.jsonl:3:" in err and message in err
    # No half-written output that could later pass for a complete file.
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["jobs.jsonl"]


def test_merge_drops_exact_duplicates_and_keeps_first(tmp_path, capsys):
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("u1\nu2\nu3\n")
    second.write_text("u3\nu4\nu1\n")
    for name in ("a", "b"):
        assert run(capsys, "pack", "--default-ids", "-o", str(tmp_path / f"{name}.zst"),
                   str(tmp_path / f"{name}.txt"))[0] == 0
    merged = tmp_path / "merged.zst"

    code, stdout, err = run(capsys, "merge", "-o", str(merged), str(tmp_path / "a.zst"),
                            str(tmp_path / "b.zst"))
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["jobs"] == 4 and summary["read"] == 6 and summary["duplicates"] == 2
    assert [job["value"] for job in read_back(merged)] == ["u1", "u2", "u3", "u4"]
    assert json.loads(run(capsys, "stat", str(merged))[1])["jobs"] == 4

    code, stdout, _ = run(capsys, "merge", "--no-dedupe", "-o", str(merged),
                          str(tmp_path / "a.zst"), str(tmp_path / "b.zst"))
    assert code == 0 and json.loads(stdout)["jobs"] == 6


def test_merge_rejects_same_id_with_other_fields(tmp_path, capsys):
    (tmp_path / "a.jsonl").write_text('{"id": "x", "value": "one"}\n')
    (tmp_path / "b.jsonl").write_text('{"id": "y", "value": "two"}\n{"id": "x", "value": "other"}\n')
    for name in ("a", "b"):
        assert run(capsys, "pack", "--jsonl", "-o", str(tmp_path / f"{name}.zst"),
                   str(tmp_path / f"{name}.jsonl"))[0] == 0
    code, _, err = run(capsys, "merge", "-o", str(tmp_path / "m.zst"), str(tmp_path / "a.zst"),
                       str(tmp_path / "b.zst"))
    assert code == 1
    assert "b.zst:2:" in err and "identity_conflict" in err
    assert not (tmp_path / "m.zst").exists()


def test_stat_rejects_a_file_that_is_not_zstd(tmp_path, capsys):
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"value": "a"}\n')
    code, _, err = run(capsys, "stat", str(plain))
    assert code == 1 and "zstd" in err


def test_usage_errors_exit_2(tmp_path, capsys):
    assert run(capsys)[0] == 2
    assert run(capsys, "pack", "--project-mode", "none", "--default-ids")[0] == 2
    assert run(capsys, "merge", str(tmp_path / "a.zst"))[0] == 2  # -o is required


def test_cli_modules_do_not_import_the_master():
    code = ("import sys, workers.hqctl, workers.source_cli; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('app', 'flask')); "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_inputs_may_follow_options(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / "b.txt").write_text("b\n")
    out = tmp_path / "ab.zst"
    code, _, err = run(capsys, "pack", str(tmp_path / "a.txt"), "--project-mode", "none",
                       str(tmp_path / "b.txt"), "-o", str(out))
    assert code == 0, err
    assert [job["value"] for job in read_back(out, "none")] == ["a", "b"]
    assert run(capsys, "pack", str(tmp_path / "a.txt"), "--bogus")[0] == 2
