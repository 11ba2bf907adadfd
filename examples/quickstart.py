"""The README's first example, runnable: a small network trained for 500 steps with ScheduleFree+,
streamed to curvecast, which forecasts its final loss (``tests/e2e/test_quickstart.py`` runs it
against a real server and checks that the forecast is useful: status ``ok`` before the end).

    curvecast serve &        # in another terminal
    python examples/quickstart.py [URL]
"""

import sys

import torch

from curvecast import Monitor, ScheduleFreePlus

STEPS = 500
torch.manual_seed(0)
teacher = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))


def batch(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and the teacher's outputs with noise (the loss cannot go below 0.01)."""
    x = torch.randn(n, 32)
    return x, teacher(x).detach() + 0.1 * torch.randn(n, 1)


x_val, y_val = batch(2048)
# A short run needs a short warmup: averaging starts at c_warmup (by default twice the 500-step
# warmup, step 1,000), and a forecast is useful once the run has averaged as long again.
opt = ScheduleFreePlus(model.parameters(), warmup_steps=STEPS // 10, c_warmup=STEPS * 3 // 20)
mon = Monitor(url=sys.argv[1] if len(sys.argv) > 1 else None, project="quickstart",
              run_name="teacher-mlp", total_steps=STEPS)
mon.watch(opt)  # the optimizer's telemetry every step, its config with the run's
for step in range(1, STEPS + 1):
    x, y = batch()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step(loss=loss)  # the Polyak step size needs the loss
    opt.zero_grad()
    mon.log(step, loss=loss)
    if step % 25 == 0:  # the forecast is of the eval loss, measured at the averaged weights x
        with opt.averaged(model), torch.no_grad():
            mon.log(step, eval_loss=torch.nn.functional.mse_loss(model(x_val), y_val))
mon.finish()
print(f"run {mon.run_id}: {STEPS} steps streamed to {mon.url}")
