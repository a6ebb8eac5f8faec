import pytest
import torch
from torch import nn

from scalesgd.models import build_model
from scalesgd.recipe import build_optimizer, build_sgd, param_groups


def _ids(group):
    return {id(p) for p in group["params"]}


def test_bn_gamma_beta_never_decayed_biases_decayed_by_default():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    decay, no_decay = param_groups(model, 1e-4)
    assert decay["weight_decay"] == 1e-4 and no_decay["weight_decay"] == 0.0
    assert _ids(no_decay) == {id(model[1].weight), id(model[1].bias)}
    assert _ids(decay) == {id(model[0].weight), id(model[0].bias), id(model[3].weight), id(model[3].bias)}


def test_no_bias_decay_moves_biases_to_the_undecayed_group():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    decay, no_decay = param_groups(model, 1e-4, bias_decay=False)
    assert _ids(decay) == {id(model[0].weight), id(model[3].weight)}
    assert id(model[3].bias) in _ids(no_decay)


def test_every_parameter_appears_exactly_once_on_a_real_model():
    model = build_model("resnet20", 10, 3)
    groups = param_groups(model, 1e-4)
    listed = [id(p) for g in groups for p in g["params"]]
    assert sorted(listed) == sorted(id(p) for p in model.parameters())
    bn_params = {id(p) for m in model.modules() if isinstance(m, nn.BatchNorm2d) for p in m.parameters()}
    assert _ids(groups[1]) == bn_params


def test_sgd_step_decays_weights_but_not_bn():
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    with torch.no_grad():
        model[1].weight.fill_(2.0)
    opt = build_sgd(model, lr=1.0, momentum=0.0, nesterov=False, weight_decay=0.5)
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    lin_w, lin_b, bn_w, bn_b = model.parameters()
    assert torch.allclose(lin_w, before[0] * 0.5)
    assert torch.equal(bn_w, before[2]) and torch.equal(bn_b, before[3])


def test_build_optimizer_gives_lars_the_same_groups_and_refuses_unknown_names():
    from scalesgd.optim import LARS
    from scalesgd.recipe import build_optimizer

    model = build_model("resnet8", 10, 1)
    opt = build_optimizer(model, "lars", lr=0.5, momentum=0.9, nesterov=False, weight_decay=1e-4,
                          trust_coefficient=0.02)
    assert isinstance(opt, LARS)
    assert [g["weight_decay"] for g in opt.param_groups] == [1e-4, 0.0]
    assert opt.param_groups[0]["trust_coefficient"] == 0.02
    sgd_groups = build_optimizer(model, "sgd", 0.5, 0.9, False, 1e-4).param_groups
    assert [len(g["params"]) for g in opt.param_groups] == [len(g["params"]) for g in sgd_groups]
    with pytest.raises(ValueError, match="choose from sgd, lars"):
        build_optimizer(model, "adam", 0.5, 0.9, False, 1e-4)


def test_muon_groups_mark_the_hidden_weights_and_keep_an_untied_head_embeddings_and_filters_on_adamw():
    from scalesgd.optim import MUON

    model = nn.Sequential(nn.Embedding(10, 8), nn.Conv1d(8, 8, 3), nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 10))
    embedding, conv, hidden, _norm, head = model
    plain = param_groups(model, 0.1, bias_decay=False)
    assert all(MUON not in g for g in plain) and len(plain) == 2  # the other optimizers' groups, as they were
    marked, free, apart = param_groups(model, 0.1, bias_decay=False, muon=True)
    assert marked[MUON] is True and _ids(marked) == {id(conv.weight), id(hidden.weight)}
    assert _ids(free) == _ids(plain[1]) and MUON not in free
    # the head is a Linear of its own here (the GPT's is its embedding, never decayed under Adam's kinds)
    assert _ids(apart) == {id(embedding.weight), id(head.weight)} and apart["weight_decay"] == 0.1 and MUON not in apart

    opt = build_optimizer(model, "muon", lr=1e-3, momentum=0.9, nesterov=False, weight_decay=0.1)
    muon, adamw = opt.inner
    assert {id(p) for g in muon.param_groups for p in g["params"]} == {id(hidden.weight)}  # 2-D and hidden alone
    assert {id(p) for g in adamw.param_groups for p in g["params"]} == {id(p) for p in model.parameters()} - {
        id(hidden.weight)}
    assert [g["weight_decay"] for g in adamw.param_groups] == [0.1, 0.0, 0.1]  # the filter, the rest, the head
