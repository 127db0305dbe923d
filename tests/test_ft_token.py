"""One grammar for the ft token (docs/ft-token.md), run through both of its implementations.

* Python: ``slurm_ft.failover.jobspec.from_comment`` / ``admin_token``;
* Lua: the rendered ``job_submit.lua`` (slurm_ft/lab/spank.py) in a real Lua interpreter, with a stub
  ``slurm`` table, through a small driver that loads the script and calls its local functions.

Debian's ``job_submit_lua.so`` (Slurm 22.05) links liblua5.1: ``lua5.1`` is the interpreter that
matters (scripts/setup-system.sh installs it); lua5.3/lua5.4 run too when present.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from slurm_ft.config import FailoverConfig
from slurm_ft.errors import ConfigError
from slurm_ft.failover import jobspec
from slurm_ft.failover.jobspec import FtOptions
from slurm_ft.lab import spank as lab_spank

VECTORS_FILE = Path(__file__).parent / "fixtures" / "ft_token_vectors.json"
DOC = json.loads(VECTORS_FILE.read_text())
DEFAULT = DOC["default_retries"]
VECTORS = DOC["vectors"]
#: lua5.1 always (skipped with the reason when missing); 5.3/5.4 when installed.
LUAS = ["lua5.1"] + [n for n in ("lua5.3", "lua5.4") if shutil.which(n)]


def comment_of(v: dict) -> str:
    if "comment" in v:
        return v["comment"]
    b = v["build"]
    return b["prefix"] + b["repeat"] * b["times"] + b["suffix"]


def python_outcome(comment: str) -> str:
    try:
        opts = jobspec.from_comment(comment, DEFAULT)
    except ConfigError:
        return "error"
    return jobspec.admin_token(opts) if opts.enabled else "not-ft"


# ----------------------------------------------------------------------------- Python
def test_vectors_file_is_sane():
    assert len(VECTORS) >= 100
    assert len({v["name"] for v in VECTORS}) == len(VECTORS)
    for v in VECTORS:
        assert v["expect"] in ("not-ft", "error") or v["expect"].startswith("ft:retries="), v


@pytest.mark.parametrize("v", VECTORS, ids=[v["name"] for v in VECTORS])
def test_python_follows_vectors(v):
    assert python_outcome(comment_of(v)) == v["expect"]


# ----------------------------------------------------------------------------- Lua
DRIVER = r"""
-- usage: lua driver.lua JOB_SUBMIT_LUA MODE [FILE]
slurm = { SUCCESS = 0, ERROR = -1, user_msgs = {} }
-- as Slurm's own: slurm.log_user = function (fmt, ...) slurm.user_msg(string.format(fmt, ...)) end
function slurm.log_user(fmt, ...) table.insert(slurm.user_msgs, string.format(fmt, ...)) end
function slurm.log_info(fmt, ...) local _ = string.format(fmt, ...) end
slurm.log_error = slurm.log_info
slurm.log_debug = slurm.log_info
local f = assert(io.open(arg[1], "rb"))
local src = f:read("*a")
f:close()
local load_ = loadstring or load
M = assert(load_(src .. "\nreturn { ft_token = ft_token, strip_token = strip_token, " ..
                 "check_comment_token = check_comment_token, parse_token = parse_token, " ..
                 "comment_options = comment_options, canonical = canonical }", "=job_submit.lua"))()

function unhex(h) return (string.gsub(h, "..", function(x) return string.char(tonumber(x, 16)) end)) end
function hex(s)
  if s == nil then return "-" end
  return (string.gsub(s, ".", function(c) return string.format("%02x", string.byte(c)) end)) .. "."
end

if arg[2] == "vectors" then
  -- one hex comment a line -> status <TAB> hex(canonical or problem) <TAB> hex(ft_token) <TAB> hex(strip_token)
  local default = tonumber(arg[4])
  for line in io.lines(arg[3]) do
    local comment = unhex(line)
    local opts, problem = M.comment_options(comment)
    local status, detail
    if problem ~= nil then status, detail = "error", problem
    elseif opts == nil then status, detail = "not-ft", ""
    else status, detail = "ok", M.canonical(opts, default) end
    io.write(status, "\t", hex(detail), "\t", hex(M.ft_token(comment)), "\t", hex(M.strip_token(comment)), "\n")
  end
end
"""


def _lua(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (Debian: apt-get install {name}; scripts/setup-system.sh "
                    "installs lua5.1, what job_submit_lua.so links)")
    return path


def _hex(s: str) -> str:
    return s.encode().hex()


def _unhex(field: str) -> str | None:
    return None if field == "-" else bytes.fromhex(field[:-1]).decode()


def _write_script(tmp_path: Path, max_retries: int = 10, default_retries: int = DEFAULT) -> Path:
    script = tmp_path / "job_submit.lua"
    script.write_text(lab_spank.render_job_submit(max_retries, default_retries))
    (tmp_path / "driver.lua").write_text(DRIVER)
    return script


def lua_outcomes(lua: str, tmp_path: Path, comments: list[str]) -> list[tuple[str, str, str | None, str]]:
    script = _write_script(tmp_path)
    inp = tmp_path / "in.hex"
    inp.write_text("".join(_hex(c) + "\n" for c in comments))
    proc = subprocess.run([lua, str(tmp_path / "driver.lua"), str(script), "vectors", str(inp), str(DEFAULT)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = []
    for line in proc.stdout.splitlines():
        status, detail, token, rest = line.split("\t")
        out.append((status, _unhex(detail), _unhex(token), _unhex(rest)))
    assert len(out) == len(comments)
    return out


def _ref_token_and_rest(comment: str) -> tuple[str | None, str]:
    ws = jobspec.words(comment)
    ft = [w for w in ws if jobspec.is_ft_word(w)]
    return (ft[0] if ft else None), " ".join(w for w in ws if not jobspec.is_ft_word(w))


@pytest.mark.parametrize("lua_name", LUAS)
def test_lua_follows_vectors(lua_name, tmp_path):
    lua = _lua(lua_name)
    comments = [comment_of(v) for v in VECTORS]
    wrong = []
    for v, comment, (status, detail, token, rest) in zip(VECTORS, comments, lua_outcomes(lua, tmp_path, comments)):
        got = {"ok": detail, "not-ft": "not-ft", "error": "error"}[status]
        if got != v["expect"]:
            wrong.append(f"{v['name']}: expected {v['expect']!r}, Lua gave {status} {detail!r}")
        if (token, rest) != _ref_token_and_rest(comment):
            wrong.append(f"{v['name']}: ft_token/strip_token differ from the word split of docs/ft-token.md")
    assert not wrong, "\n".join(wrong)


FRAGMENTS = ["ft", "ft:", "ft", "FT", "x", "a,", ";", ",", ",", "=", "retries", "retries=", "ckpt_signal=",
             "ckpt_wait=", "hang_timeout=", "1", "0", "00", "3", "100", "101", "60", "3600", "604800", "usr2",
             "SIG", "USR1", "Winch", "12", "-", "+", "_", " ", " ", "  ", "\t", "\n", "\r", "\x0b", "\x0c",
             "\u00a0", "\u2003", "\u0085", "\x1c", "\u017f", "\u0131", "\u0663", "\u00b2", "\ufeff", "é", "ſ"]


@pytest.mark.parametrize("lua_name", LUAS)
def test_python_and_lua_agree_on_random_comments(lua_name, tmp_path):
    """Differential test: 3000 random comments from the tricky pieces; both sides must agree."""
    lua = _lua(lua_name)
    rng = random.Random(20261130)
    comments = ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 14))) for _ in range(3000)]
    comments += ["ft:" + ",".join(rng.choice(["retries=2", "ckpt_wait=9", "ckpt_signal=hup", "hang_timeout=60",
                                              "retries=", "", "x=1"]) for _ in range(rng.randint(1, 4)))
                 for _ in range(1000)]
    wrong = []
    for comment, (status, detail, _, _) in zip(comments, lua_outcomes(lua, tmp_path, comments)):
        lua_says = {"ok": detail, "not-ft": "not-ft", "error": "error"}[status]
        py_says = python_outcome(comment)
        if lua_says != py_says:
            wrong.append(f"{comment!r}: Python {py_says!r}, Lua {lua_says!r}")
    assert not wrong, "\n".join(wrong[:20])
    outcomes = {python_outcome(c) if python_outcome(c) in ("error", "not-ft") else "ok" for c in comments}
    assert outcomes == {"error", "not-ft", "ok"}


# --- job_submit / job_modify end to end, with stub job_desc / job_rec tables
ORIG = "ft:retries=2,ckpt_signal=USR2,ckpt_wait=60,hang_timeout=0"


def _lua_quote(s: str | None) -> str:
    if s is None:
        return "nil"
    return '"' + "".join(f"\\{b}" for b in s.encode()) + '"'


def run_submit(lua: str, tmp_path: Path, *, comment: str | None = None, spank: dict | None = None,
               max_retries: int = 10, default_retries: int = DEFAULT, uid: int = 1001,
               work_dir: str | None = None) -> dict:
    """slurm_job_submit on a stub job_desc; returns rc, comment, admin_comment, requeue, msgs."""
    script = _write_script(tmp_path, max_retries, default_retries)
    env = [f"{k}={v}" for k, v in (spank or {}).items()]
    env_lua = "{" + ", ".join(f"[{i}] = {_lua_quote(e)}" for i, e in enumerate(env)) + "}"
    body = f"""
local jd = {{ comment = {_lua_quote(comment)}, spank_job_env = {env_lua}, spank_job_env_size = {len(env)},
             work_dir = {_lua_quote(work_dir)} }}
local rc = slurm_job_submit(jd, {{}}, {uid})
print("rc", rc)
print("comment", hex(jd.comment))
print("admin_comment", hex(jd.admin_comment))
print("requeue", tostring(jd.requeue))
print("msgs", hex(table.concat(slurm.user_msgs, "\\n")))
"""
    return _run_body(lua, tmp_path, script, body)


def run_modify(lua: str, tmp_path: Path, *, old: str | None, new: str | None, work_dir: str | None = None) -> dict:
    script = _write_script(tmp_path)
    body = f"""
local jd = {{ comment = {_lua_quote(new)}, work_dir = {_lua_quote(work_dir)} }}
local rec = {{ comment = {_lua_quote(old)} }}
local rc = slurm_job_modify(jd, rec, {{}}, 1001)
print("rc", rc)
print("comment", hex(jd.comment))
"""
    return _run_body(lua, tmp_path, script, body)


def _run_body(lua: str, tmp_path: Path, script: Path, body: str) -> dict:
    (tmp_path / "body.lua").write_text(DRIVER + body)
    proc = subprocess.run([lua, str(tmp_path / "body.lua"), str(script), "body"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("\t")
        out[key] = _unhex(value) if key in ("comment", "admin_comment", "msgs") else value
    out["rc"] = int(float(out["rc"]))
    return out


SPANK = {"FT": "1", "FT_RETRIES": "2", "FT_CKPT_SIGNAL": "USR2", "FT_CKPT_WAIT": "60", "FT_HANG_TIMEOUT": "0",
         "FT_RETRIES_GIVEN": "1"}


@pytest.fixture(params=LUAS)
def lua(request):
    return _lua(request.param)


def test_submit_spank_writes_comment_and_admin_comment(lua, tmp_path):
    r = run_submit(lua, tmp_path, comment="my run ft:retries=50", spank=SPANK)
    assert r["rc"] == 0 and r["requeue"] == "1"
    assert r["comment"] == ORIG + " my run"          # the comment's own ft word is dropped: SPANK wins
    assert r["admin_comment"] == "slurm-ft:submitted " + ORIG
    assert jobspec.from_admin_comment(r["admin_comment"]) == jobspec.from_comment(r["comment"], 3)


def test_submit_spank_over_site_max_is_refused(lua, tmp_path):
    r = run_submit(lua, tmp_path, spank={**SPANK, "FT_RETRIES": "50"}, max_retries=10)
    assert r["rc"] == -1 and r["admin_comment"] is None
    assert "--ft-retries=50" in r["msgs"] and "maximum of 10" in r["msgs"] and "max_retries" in r["msgs"]
    assert run_submit(lua, tmp_path, spank={**SPANK, "FT_RETRIES": "10"}, max_retries=10)["rc"] == 0


def test_submit_spank_without_retries_gets_site_default(lua, tmp_path):
    r = run_submit(lua, tmp_path, spank={**SPANK, "FT_RETRIES": "3", "FT_RETRIES_GIVEN": "0"}, default_retries=5)
    assert r["rc"] == 0 and r["admin_comment"].startswith("slurm-ft:submitted ft:retries=5,")
    # a plugin built before FT_RETRIES_GIVEN: its value counts
    old = {k: v for k, v in SPANK.items() if k != "FT_RETRIES_GIVEN"}
    r = run_submit(lua, tmp_path, spank=old, default_retries=5)
    assert r["rc"] == 0 and r["admin_comment"] == "slurm-ft:submitted " + ORIG


@pytest.mark.parametrize("key, value", [("FT_HANG_TIMEOUT", "5"), ("FT_CKPT_WAIT", "0"), ("FT_CKPT_SIGNAL", "KILL"),
                                        ("FT_RETRIES", "x"), ("FT_RETRIES", "101")])
def test_submit_spank_bad_values_refused(lua, tmp_path, key, value):
    r = run_submit(lua, tmp_path, spank={**SPANK, key: value})
    assert r["rc"] == -1 and r["msgs"].startswith("slurm_ft: --ft-")


def test_submit_legacy_comment(lua, tmp_path):
    r = run_submit(lua, tmp_path, comment="ft", default_retries=5)
    token = "ft:retries=5,ckpt_signal=USR1,ckpt_wait=600,hang_timeout=0"
    assert (r["rc"], r["comment"], r["admin_comment"], r["requeue"]) == (0, token, "slurm-ft:submitted " + token, "1")
    r = run_submit(lua, tmp_path, comment="notes ft:ckpt_signal=sigusr2,retries=1 more")
    token = "ft:retries=1,ckpt_signal=USR2,ckpt_wait=600,hang_timeout=0"
    assert (r["comment"], r["admin_comment"]) == (token + " notes more", "slurm-ft:submitted " + token)


def test_submit_legacy_over_site_max_and_malformed_refused(lua, tmp_path):
    r = run_submit(lua, tmp_path, comment="ft:retries=50", max_retries=10)
    assert r["rc"] == -1 and "--comment=ft:retries=50" in r["msgs"] and "maximum of 10" in r["msgs"]
    for bad in ("ft:retries=1 ft:retries=2", "ft:", "ft:retries=2,retries=2", "ft:%s%d%n"):
        r = run_submit(lua, tmp_path, comment=bad)
        assert r["rc"] == -1 and r["msgs"].startswith("slurm_ft: --comment: "), (bad, r)
    assert "%s%d%n" in r["msgs"]      # user text is an argument of log_user's format, not the format


def test_submit_not_ft_is_left_alone(lua, tmp_path):
    for comment in (None, "plain", "x,ft:retries=100", "FT:retries=9"):
        r = run_submit(lua, tmp_path, comment=comment)
        assert (r["rc"], r["comment"], r["admin_comment"], r["requeue"]) == (0, comment, None, "nil")


@pytest.mark.parametrize("new, expect", [
    (f"x,ft:retries=100,ckpt_wait=5 {ORIG}", f"{ORIG} x,ft:retries=100,ckpt_wait=5"),   # the attack
    ("a;ft:retries=7 ft:retries=1", f"{ORIG} a;ft:retries=7"),
    ("ft:retries=100 hi", f"{ORIG} hi"),
    ("", ORIG),
    (f"{ORIG} slurm-ft-ckpt:state=saved,attempt=0,t=1.0", f"{ORIG} slurm-ft-ckpt:state=saved,attempt=0,t=1.0"),
])
def test_modify_keeps_the_token(lua, tmp_path, new, expect):
    r = run_modify(lua, tmp_path, old=f"{ORIG} notes", new=new)
    assert (r["rc"], r["comment"]) == (0, expect)
    assert jobspec.from_comment(r["comment"], 3) == jobspec.from_comment(ORIG, 3)


def test_modify_cannot_add_a_token(lua, tmp_path):
    r = run_modify(lua, tmp_path, old="plain", new="ft:retries=100 x")
    assert r["comment"] == "x" and not jobspec.from_comment(r["comment"], 3).enabled
    assert run_modify(lua, tmp_path, old=ORIG, new=None)["comment"] is None


# ----------------------------------------------------------------------------- admin_comment, clamp
OPTS = FtOptions(True, 2, "USR2", 20, 1800)
TOKEN = "ft:retries=2,ckpt_signal=USR2,ckpt_wait=20,hang_timeout=1800"


def test_admin_token_is_canonical():
    assert jobspec.admin_token(OPTS) == TOKEN
    assert jobspec.admin_token(FtOptions(True, 0)) == "ft:retries=0,ckpt_signal=USR1,ckpt_wait=600,hang_timeout=0"
    assert jobspec.admin_record("submitted", OPTS) == "slurm-ft:submitted " + TOKEN
    assert jobspec.from_comment(TOKEN, 3) == OPTS


@pytest.mark.parametrize("text", [
    f"slurm-ft:submitted {TOKEN}",
    f"slurm-ft:running {TOKEN} (attempt 1)",
    f"slurm-ft:running (attempt 1) {TOKEN}",
    f"slurm-ft:failover-in-progress\t{TOKEN}\n",
    f"slurm-ft:submitted {TOKEN} ft:retries=100,ckpt_signal=USR1,ckpt_wait=600,hang_timeout=0",   # first counts
])
def test_from_admin_comment(text):
    assert jobspec.from_admin_comment(text) == OPTS


@pytest.mark.parametrize("text", [None, "", "slurm-ft:requeued", "slurm-ft: held: excluding n1 leaves 0 usable node(s)",
                                  TOKEN, f"{TOKEN} slurm-ft:submitted", f"admin note {TOKEN}",
                                  "slurm-ft:submitted ft", f"slurm-ft:submitted\u00a0{TOKEN}",
                                  f"slurm-ft:submitted x{TOKEN}"])
def test_from_admin_comment_absent(text):
    assert jobspec.from_admin_comment(text) is None


@pytest.mark.parametrize("token", [
    "ft:retries=3",                                                          # not all four keys
    "ft:retries=03,ckpt_signal=USR1,ckpt_wait=600,hang_timeout=0",           # leading zero
    "ft:retries=3,ckpt_signal=usr1,ckpt_wait=600,hang_timeout=0",            # lower case
    "ft:retries=3,ckpt_signal=SIGUSR1,ckpt_wait=600,hang_timeout=0",
    "ft:ckpt_signal=USR1,retries=3,ckpt_wait=600,hang_timeout=0",            # order
    "ft:retries=101,ckpt_signal=USR1,ckpt_wait=600,hang_timeout=0",          # range
    "ft:retries=3,ckpt_signal=USR1,ckpt_wait=600,hang_timeout=0,retries=3",  # duplicate
    "ft:retries=3,ckpt_signal=USR1,ckpt_wait=600,hang_timeout=0,",           # empty item
    "ft:retries=3,ckpt_signal=USR1,ckpt_wait=600,hang_timeout=0;x",
    "ft:",
])
def test_from_admin_comment_malformed(token):
    with pytest.raises(ConfigError):
        jobspec.from_admin_comment(f"slurm-ft:submitted {token}")


def test_admin_round_trip():
    rng = random.Random(7)
    for _ in range(300):
        o = FtOptions(True, rng.randint(0, 100), rng.choice(jobspec.CKPT_SIGNALS), rng.randint(1, 3600),
                      rng.choice([None, 60, rng.randint(60, 604800), 604800]))
        assert jobspec.from_admin_comment(jobspec.admin_record(rng.choice(["submitted", "running"]), o)) == o
        assert jobspec.from_comment(jobspec.admin_token(o), 3) == o


def test_clamp():
    assert jobspec.clamp(FtOptions(True, 50, "USR2", 20, 60), 10) == FtOptions(True, 10, "USR2", 20, 60)
    o = FtOptions(True, 2)
    assert jobspec.clamp(o, 10) is o and jobspec.clamp(o, 2) is o
    assert jobspec.clamp(FtOptions(True, 100), 0).retries == 0
    assert jobspec.clamp(FtOptions(False, 7), 3) == FtOptions(False, 3)


# ----------------------------------------------------------------------------- rendering
def test_render_job_submit_limits():
    text = lab_spank.render_job_submit(7, 2)
    assert "local MAX_RETRIES = 7 " in text and "local DEFAULT_RETRIES = 2 " in text
    assert "@MAX_RETRIES@" not in text and "@DEFAULT_RETRIES@" not in text
    d = FailoverConfig()
    assert f"local MAX_RETRIES = {d.max_retries} " in lab_spank.render_job_submit()
    assert f"local DEFAULT_RETRIES = {d.retries} " in lab_spank.render_job_submit()


@pytest.mark.parametrize("args", [(5, 7), (101, 3), (10, -1), ("10", 3), (10, 3.0), (True, 0)])
def test_render_job_submit_refuses_bad_limits(args):
    with pytest.raises(ValueError):
        lab_spank.render_job_submit(*args)


def test_write_files_renders_site_limits(tmp_path, monkeypatch):
    monkeypatch.setattr(lab_spank, "plugin_path", lambda repo=None: tmp_path / "missing.so")
    lab_spank.write_files(tmp_path, log=lambda *_: None, failover=FailoverConfig(retries=2, max_retries=4))
    text = (tmp_path / "job_submit.lua").read_text()
    assert "local MAX_RETRIES = 4 " in text and "local DEFAULT_RETRIES = 2 " in text


@pytest.mark.parametrize("luac_name", ["luac5.1"] + [n for n in ("luac5.3", "luac5.4") if shutil.which(n)])
def test_rendered_job_submit_compiles(luac_name, tmp_path):
    luac = shutil.which(luac_name)
    if luac is None:
        pytest.skip(f"{luac_name} not installed")
    f = tmp_path / "job_submit.lua"
    f.write_text(lab_spank.render_job_submit(10, 3))
    proc = subprocess.run([luac, "-p", str(f)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("lua_name", LUAS)
def test_a_line_break_in_the_working_directory_is_refused_at_submit_and_modify(lua_name, tmp_path):
    """WorkDir is printed unescaped in ``scontrol show job``: a line break in it could add lines that
    read as fields Slurm printed (an AdminComment record on a job without one). Every job, ft or
    not, with a CR or LF anywhere in ``--chdir`` is refused; any other directory passes."""
    from hypothesis import given, settings, strategies as st

    lua = _lua(lua_name)
    forged = "/home/u/x\n   AdminComment=slurm-ft:submitted ft:retries=9"
    for spank in (None, SPANK):
        out = run_submit(lua, tmp_path, comment="plain job", spank=spank, work_dir=forged)
        assert out["rc"] == -1 and "line break" in out["msgs"], out
    assert run_modify(lua, tmp_path, old="x", new=None, work_dir="/w\r")["rc"] == -1
    assert run_modify(lua, tmp_path, old="x", new="y", work_dir=None)["rc"] == 0

    @settings(max_examples=25, deadline=None)
    @given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
    def check(work_dir):
        out = run_submit(lua, tmp_path, comment="plain job", work_dir=work_dir)
        assert (out["rc"] == -1) == ("\n" in work_dir or "\r" in work_dir), (work_dir, out)

    check()
