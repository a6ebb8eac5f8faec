"""scalesgd's exchange inside a PyTorch Lightning Trainer: top-k with residuals as DDP's comm hook, its state saved
in Lightning's checkpoints and restored on resume, so a resumed run ends exactly where an uninterrupted one does.

    python examples/lightning.py --epochs 4 --checkpoint-dir ckpt --stop-after 2   # Lightning starts 2 workers
    python examples/lightning.py --epochs 4 --resume ckpt/last.ckpt

Lightning registers `ddp_comm_hook` only on CUDA devices; `CompressorHook` registers it on CPUs too.
"""

import argparse
import json
import sys
from pathlib import Path

# This file is named after the package it shows: keep its folder off the import path, or `import lightning` finds it.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import lightning as L  # noqa: E402 (after the path fix above)
import torch  # noqa: E402
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

from scalesgd import CodecHookState, codec_hook
from scalesgd.comm.codecs import CodecSettings, TopkOptions
from scalesgd.recipe import LrFactor, build_scheduler


def teacher_task(samples=4096, features=32, classes=10):
    """Inputs labelled by a fixed random linear teacher: a task a small MLP learns in a few epochs."""
    g = torch.Generator().manual_seed(0)
    x, teacher = torch.randn(samples, features, generator=g), torch.randn(features, classes, generator=g)
    return TensorDataset(x, (x @ teacher).argmax(1))


class Classifier(L.LightningModule):
    def __init__(self, epochs: int, lr: float = 0.2):
        super().__init__()
        self.epochs, self.lr = epochs, lr
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        self.loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
        self.losses = []  # (epoch, mean loss over this worker's batches)

    def training_step(self, batch, index):
        x, y = batch
        loss = self.loss_fn(self.net(x), y)
        self.log("loss", loss, on_step=False, on_epoch=True, sync_dist=True)  # mean over workers, each epoch
        return loss

    def on_train_epoch_end(self):
        self.losses.append((self.current_epoch, round(float(self.trainer.callback_metrics["loss"]), 4)))

    def train_dataloader(self):  # Lightning adds the DistributedSampler: one shuffle split among workers
        return DataLoader(teacher_task(), batch_size=128, shuffle=True, drop_last=True)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        steps = self.trainer.estimated_stepping_batches
        per_epoch = steps // self.epochs
        factor = LrFactor(total_steps=steps, steps_per_epoch=per_epoch, warmup="gradual",
                          warmup_steps=per_epoch, start=0.25, schedule="cosine")  # one pure function of the step
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": build_scheduler(optimizer, factor),
                                                         "interval": "step"}}


class CompressorHook(Callback):
    """Registers the hook where Lightning does not (CPU), puts every rank's codec state (each rank's residuals
    differ) into the checkpoint rank 0 writes, and gives each rank its own back when a run resumes."""

    def __init__(self, state: CodecHookState):
        self.state = state

    def on_fit_start(self, trainer, module):
        if trainer.strategy.root_device.type != "cuda":
            self.state.connect()
            trainer.strategy.model.register_comm_hook(self.state, codec_hook)

    def on_save_checkpoint(self, trainer, module, checkpoint):
        checkpoint["scalesgd_hook"] = self.state.state_dicts_of_all_ranks()  # collective: every rank saves

    def on_load_checkpoint(self, trainer, module, checkpoint):
        self.state.load_state_dict(checkpoint["scalesgd_hook"][trainer.global_rank])

    def on_fit_end(self, trainer, module):
        self.state.close()


class StopAfter(Callback):
    """Ends the run after some epochs, as an interruption would (the last checkpoint is still written)."""

    def __init__(self, epochs: int):
        self.epochs = epochs

    def on_train_epoch_end(self, trainer, module):
        trainer.should_stop = trainer.should_stop or trainer.current_epoch + 1 >= self.epochs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--codec", default="topk", help="any scalesgd codec: fp16, bf16, fp8, topk, lags, …")
    parser.add_argument("--density", type=float, default=0.05, help="top-k: the fraction of entries sent")
    parser.add_argument("--checkpoint-dir", help="keep last.ckpt here after every epoch")
    parser.add_argument("--stop-after", type=int, help="stop after this many epochs, as if interrupted")
    parser.add_argument("--resume", help="a checkpoint to continue from")
    parser.add_argument("--params", help="save the final parameters to this file")
    args = parser.parse_args()

    L.seed_everything(0, verbose=False)
    module = Classifier(args.epochs)
    # a short demo: compress from the first step (a real run keeps the defaults: dense start, density warm-up)
    state = CodecHookState(args.codec, settings=CodecSettings(TopkOptions(density=args.density, density_warmup=0)),
                           compress_after=0, model=module)
    callbacks = [CompressorHook(state)]
    if args.checkpoint_dir:
        callbacks.append(ModelCheckpoint(dirpath=args.checkpoint_dir, save_last=True, save_top_k=0))
    if args.stop_after:
        callbacks.append(StopAfter(args.stop_after))
    trainer = L.Trainer(
        accelerator="cpu", devices=2, max_epochs=args.epochs, callbacks=callbacks, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=bool(args.checkpoint_dir),
        strategy=DDPStrategy(process_group_backend="gloo", ddp_comm_state=state, ddp_comm_hook=codec_hook))
    trainer.fit(module, ckpt_path=args.resume)
    if trainer.global_rank == 0:
        steps = trainer.global_step - (torch.load(args.resume, weights_only=False)["global_step"]
                                       if args.resume else 0)
        if args.params:
            torch.save({k: v.detach().clone() for k, v in module.state_dict().items()}, args.params)
        print(json.dumps({"losses": [loss for _, loss in module.losses], "codec": args.codec, "world": 2,
                          "steps": steps, "parameters": sum(p.numel() for p in module.parameters()),
                          "bytes_per_step": state.bytes_sent / max(steps, 1), "counters": state.counters()}))


if __name__ == "__main__":
    main()
