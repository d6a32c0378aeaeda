"""Faults a new user hit on the command line (issue 40's medium and low items): each refused with
the cause and the fix, or shown as what it is."""



def test_mesh_auto_blames_divisibility_not_the_budget(cli):
    # tiny-llama on 8 devices: tensor=8 and tensor=4 are refused by its heads (4 query, 2 key/value
    # heads), so every mesh splits the batch 4 or 8 ways; 7 sequences divide neither.
    r = cli("plan", "--model", "tiny-llama", "--mesh", "auto", "--devices", "8",
            "--global-batch", "7")  # fmt: skip
    assert r.returncode == 2
    assert "global batch 7 is not divisible" in r.stderr and "4, 8 ways" in r.stderr
    assert "multiple of 4" in r.stderr
    assert "the closest:" not in r.stderr and "within the device budget" not in r.stderr
