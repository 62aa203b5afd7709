"""Quality against memory with fastgen.Model.eval, plotted with matplotlib (pip install matplotlib pandas).

fastgen-adaptive at each budget, the peer methods at the memory it kept on each prompt; the rows are
`fastgen eval --sweep --json`'s. Run: python examples/python/sweep_plot.py [MODEL.gguf] [OUT.png]
"""

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

import fastgen  # noqa: E402

model = fastgen.Model(sys.argv[1] if len(sys.argv) > 1 else None)
prompts = [
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg",
    "To bake a simple loaf of bread you need flour, water, salt and yeast. First,",
    "The solar system has eight planets. The closest to the sun is Mercury, and",
    "In the morning the market square filled with traders selling fish, bread and",
]
rows = pd.DataFrame(model.eval(prompts, budgets=[0.25, 0.5, 0.8], steps=32))
print(rows[["budget", "method", "kv_kept", "kl_mean", "top1"]].to_string(index=False))
for method, g in rows.groupby("method", sort=False):
    plt.plot(g["kv_kept"], g["kl_mean"], marker="o", label=method)
plt.xlabel("KV cache kept (share of the full cache)")
plt.ylabel("mean KL(full || compressed)")
plt.yscale("log")
plt.legend()
plt.title(f"{model.path.rsplit('/', 1)[-1]}: quality against memory")
out = sys.argv[2] if len(sys.argv) > 2 else "sweep.png"
plt.savefig(out, dpi=120)
print("wrote", out)
