"""`slurm-ft lab env --dir DIR` exports the lab directory, and every `slurm-ft lab` command then
uses it (``$SLURM_FT_LAB_DIR``) without repeating ``--dir``. No Slurm daemon is started."""

from __future__ import annotations

import shlex

from click.testing import CliRunner

from slurm_ft.cli.main import main


def test_lab_env_exports_the_dir_and_lab_commands_follow_it(tmp_path):
    lab = tmp_path / "my lab"
    r = CliRunner().invoke(main, ["lab", "env", "--dir", str(lab)])
    assert r.exit_code == 0
    exports = dict(line.removeprefix("export ").split("=", 1) for line in r.output.splitlines())
    assert {k: shlex.split(v)[0] for k, v in exports.items()} == {
        "SLURM_FT_LAB_DIR": str(lab), "SLURM_CONF": str(lab / "slurm.conf"),
        "SLURM_FT_CONFIG": str(lab / "slurm-ft.toml")}
    # after eval: status, env (and up, down, ...) take the directory from the environment
    env = {"SLURM_FT_LAB_DIR": str(lab)}
    r = CliRunner().invoke(main, ["lab", "status"], env=env)
    assert r.exit_code == 1 and r.output.splitlines()[0] == f"lab {lab}: not running"
    r = CliRunner().invoke(main, ["lab", "env"], env=env)
    assert f"export SLURM_CONF={shlex.quote(str(lab / 'slurm.conf'))}" in r.output
    # an explicit --dir still wins
    other = tmp_path / "other"
    r = CliRunner().invoke(main, ["lab", "status", "--dir", str(other)], env=env)
    assert r.output.splitlines()[0] == f"lab {other}: not running"
