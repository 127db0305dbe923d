"""The image-pull-failed final state (issue 22: the seed's imagepullbackoff on Slurm): one mapping,
policy.visible_final, for every path that ends a job; every final state has an exit code for
`slurm-ft wait` and a sentence for the owner."""

from hypothesis import given, strategies as st

from slurm_ft.job import wait
from slurm_ft.failover import marker, policy

RULES = ["image-pull-rejected", "image-pull-transient", "image-pull-failed", "cuda-oom", "exit-nonzero",
         "xid-79", "nccl-timeout", "unverified:xid-79"]
CLASSES = ["hardware", "user", "infra", "hang", "unknown"]
verdicts = st.lists(st.fixed_dictionaries({"node": st.sampled_from(["n1", "n2"]), "verdict": st.sampled_from(CLASSES),
                                           "rule": st.sampled_from(RULES)}), max_size=4)


def test_a_rejected_image_ends_in_its_own_state():
    d = policy.decide(slurm_state="FAILED", failovers_done=0, retries=3, job_nodes=["n1"], seconds_since_end=10,
                      verdicts=[{"node": "n1", "verdict": "user", "rule": "image-pull-rejected"}])
    assert d.kind == policy.USER_ERROR and policy.visible_final(d.kind, d.verdicts) == policy.IMAGE_PULL_FAILED


def test_a_transient_pull_failure_is_retried_then_ends_as_image_pull_failed():
    v = [{"node": "n1", "verdict": "infra", "rule": "image-pull-transient"}]
    first = policy.decide(slurm_state="FAILED", failovers_done=0, retries=3, job_nodes=["n1"], seconds_since_end=10,
                          verdicts=v)
    assert first.kind == "failover" and not first.blamed_nodes
    last = policy.decide(slurm_state="FAILED", failovers_done=1, retries=3, job_nodes=["n2"], seconds_since_end=10,
                         verdicts=v, unblamed_done=1, site=policy.SitePolicy(unblamed_retries=1))
    assert last.kind == policy.MAX_RETRIES
    assert policy.visible_final(last.kind, last.verdicts) == policy.IMAGE_PULL_FAILED


@given(st.sampled_from(sorted(policy.FINAL_STATES | {"failover", "wait", policy.EVACUATE})), verdicts)
def test_visible_final_only_renames_a_give_up_caused_by_the_image(kind, vs):
    out = policy.visible_final(kind, vs)
    image = any(v["rule"].startswith("image-pull") for v in vs)
    hardware = any(v["verdict"] == "hardware" for v in vs)
    if kind in (policy.USER_ERROR, policy.FAILED, policy.MAX_RETRIES) and image and not hardware:
        assert out == policy.IMAGE_PULL_FAILED
    else:
        assert out == kind        # a hardware fault, a success, a cancel: never hidden behind the image


def test_every_give_up_state_has_an_exit_code_and_a_sentence():
    assert policy.IMAGE_PULL_FAILED in policy.FINAL_STATES
    assert wait.EXIT_CODES[policy.IMAGE_PULL_FAILED] == 10
    codes = [c for k, c in wait.EXIT_CODES.items() if k != policy.NOT_CONFIGURED]
    assert len(codes) == len(set(codes))          # one code per outcome (not-configured shares failed's)
    assert "container image" in marker.FIX[policy.IMAGE_PULL_FAILED]
