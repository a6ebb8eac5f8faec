"""`--optimizer muon`: torch's Muon on the GPT's hidden matrices and torch's AdamW on the rest, as one optimizer whose
state round-trips through a checkpoint file, whose rates a scheduler sets, and which a periodic run trains with."""

from __future__ import annotations

import copy
import json

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from scalesgd.models import build_model, gpt
from scalesgd.models.gpt import GptOptions
from scalesgd.optim import MuonAdamW
from scalesgd.recipe import build_optimizer
from tests.train.cli import load_ckpt, scalesgd

LR, BETAS, DECAY = 1e-3, (0.9, 0.95), 0.1


def muon_on(model: nn.Module) -> MuonAdamW:
    return build_optimizer(model, "muon", lr=LR, momentum=0.9, nesterov=False, weight_decay=DECAY, betas=BETAS)


def tiny_gpt() -> nn.Module:
    torch.manual_seed(0)
    return gpt(64, GptOptions(layers=1, heads=2, width=32, block=16))


def set_grads(model: nn.Module, gen: torch.Generator) -> None:
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)


def held(optimizer: torch.optim.Optimizer) -> set[int]:
    return {id(p) for group in optimizer.param_groups for p in group["params"]}


def test_the_gpts_hidden_matrices_take_torchs_muon_steps_and_its_embeddings_head_biases_and_norms_adamws():
    model = build_model("gpt", 256, 1)  # the default GPT: 4 blocks of width 128, its head tied to the embedding
    opt = muon_on(model)
    muon, adamw = opt.inner
    assert type(muon) is torch.optim.Muon and type(adamw) is torch.optim.AdamW
    hidden = {id(m.weight) for block in model.blocks for m in (block.attn.qkv, block.attn.proj, block.mlp[0],
                                                                block.mlp[2])}
    assert held(muon) == hidden and len(hidden) == 16
    assert held(adamw) == {id(p) for p in model.parameters()} - hidden
    assert {id(model.tok.weight), id(model.head.weight), id(model.pos.weight), id(model.ln.weight),
            id(model.blocks[0].attn.qkv.bias)} <= held(adamw)
    assert all(a is b for a, b in zip(opt.param_groups, muon.param_groups + adamw.param_groups, strict=True))
    assert [g["weight_decay"] for g in opt.param_groups] == [DECAY, 0.0]  # no decay on biases, norms, embeddings

    matrix, embedding = model.blocks[1].mlp[0].weight, model.tok.weight
    copies = {id(p): nn.Parameter(p.detach().clone()) for p in (matrix, embedding)}
    own = [torch.optim.Muon([copies[id(matrix)]], lr=LR, weight_decay=DECAY, adjust_lr_fn="match_rms_adamw"),
           torch.optim.AdamW([copies[id(embedding)]], lr=LR, betas=BETAS, weight_decay=0.0)]
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        set_grads(model, gen)
        for p in (matrix, embedding):
            copies[id(p)].grad = p.grad.clone()
        opt.step()
        for o in own:
            o.step()
    assert torch.equal(matrix, copies[id(matrix)]) and torch.equal(embedding, copies[id(embedding)])
    assert set(opt.state[matrix]) == {"momentum_buffer"} and set(opt.state[embedding]) == {"exp_avg", "exp_avg_sq",
                                                                                              "step"}
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_a_state_dict_saved_to_a_file_loads_weights_only_into_a_fresh_optimizer_that_steps_bit_identically(tmp_path):
    model, gen = tiny_gpt(), torch.Generator().manual_seed(1)
    opt = muon_on(model)
    for _ in range(3):
        set_grads(model, gen)
        opt.step()
    torch.save(opt.state_dict(), tmp_path / "optimizer.pt")
    twin, unloaded = copy.deepcopy(model), copy.deepcopy(model)
    resumed, fresh = muon_on(twin), muon_on(unloaded)
    resumed.load_state_dict(torch.load(tmp_path / "optimizer.pt", weights_only=True))
    for _ in range(2):
        set_grads(model, gen)
        for other in (twin, unloaded):
            for p, q in zip(model.parameters(), other.parameters()):
                q.grad = p.grad.clone()
        for o in (opt, resumed, fresh):
            o.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))
    # the state matters: without it both parts step otherwise (Muon's momentum, AdamW's moments and step count)
    for name in ("blocks.0.mlp.0.weight", "tok.weight"):
        assert not torch.equal(model.get_parameter(name), unloaded.get_parameter(name)), name


def test_lambda_lr_sets_the_rate_of_both_parts():
    model = tiny_gpt()
    opt = muon_on(model)
    scheduler = LambdaLR(opt, lambda step: 0.0 if step == 0 else 0.5)
    set_grads(model, torch.Generator().manual_seed(2))
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()  # at rate 0 neither Muon's nor AdamW's step (nor their decay) moves a weight
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    scheduler.step()
    assert [g["lr"] for o in opt.inner for g in o.param_groups] == [LR * 0.5] * 2
    opt.step()
    assert all(not torch.equal(p, b) for p, b in zip(model.parameters(), before))


TEXT_RUN = ["--quiet", "--dataset", "text", "--model", "gpt", "--samples", "96", "--gpt-layers", "1", "--gpt-width",
            "32", "--gpt-heads", "2", "--gpt-block", "16", "--batch-size", "16", "--base-batch", "16", "--epochs", "1",
            "--warmup", "none", "--seed", "1"]


def test_train_offers_muon_and_two_periodic_workers_train_with_it_and_resume(tmp_path):
    assert "onebit-adam | muon:" in " ".join(scalesgd("train", "--help").stdout.split())
    run = tmp_path / "run"
    proc = scalesgd("train", *TEXT_RUN, "--workers", "2", "--local-steps", "4", "--optimizer", "muon",
                    "--run-dir", str(run))
    assert proc.returncode == 0, proc.stderr
    config = json.loads((run / "config.json").read_text())
    assert (config["optimizer"], config["base_lr"], config["weight_decay"]) == ("muon", 1e-3, 0.1)  # AdamW's recipe
    saved = load_ckpt(run)["optimizer"]
    muon_group, adamw_group = saved["param_groups"]
    assert muon_group["adjust_lr_fn"] == "match_rms_adamw" and (muon_group["momentum"], muon_group["nesterov"]) == (
        0.95, True)
    assert [sorted(saved["state"][i]) for i in muon_group["params"]] == [["momentum_buffer"]] * 4  # 1 block's
    assert all("exp_avg" in saved["state"][i] for i in adamw_group["params"])
    proc = scalesgd("train", "--resume", str(run), "--epochs", "2")
    assert proc.returncode == 0, proc.stderr
    assert load_ckpt(run)["epoch"] == 2
