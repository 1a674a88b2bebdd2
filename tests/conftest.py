import os
import sys
from pathlib import Path

import torch

# Tiny models: one thread is fastest and keeps parallel subprocesses from oversubscribing.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).parent))
