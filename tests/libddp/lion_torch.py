"""Lion in a few lines of PyTorch, for the tests that compare libddp's Lion with torch.

torch has no Lion. This is Chen et al. 2023, Algorithm 2, with decoupled weight decay, written as
the common PyTorch implementation (lion-pytorch) writes it; man/libddp.3 gives the same formula:
    c = b1*m + (1-b1)*g;  p = p*(1 - lr*wd) - lr*sign(c);  m = b2*m + (1-b2)*g
Its momentum is the state "exp_avg". Imported by tests/libddp/optim_torch.py and
tests/trainer/torch_reference.py (each puts this directory on sys.path).
"""
import torch


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, Algorithm 2) with decoupled weight decay, as lion-pytorch."""

    def __init__(self, params, lr, betas, weight_decay):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, (b1, b2), wd = group["lr"], group["betas"], group["weight_decay"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                p.mul_(1 - lr * wd)
                update = m.clone().mul_(b1).add_(p.grad, alpha=1 - b1).sign_()
                p.add_(update, alpha=-lr)
                m.mul_(b2).add_(p.grad, alpha=1 - b2)
