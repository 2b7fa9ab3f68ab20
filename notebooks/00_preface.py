# %% [markdown]
# # 0 Preface

# %%
from llmbook.nbtools import Checks

checks = Checks("smoke")
checks.close("one", 1.0, 1.0 + 1e-17, tol=1e-12)
checks.equal("ids", [1, 2], [1, 2])
checks
