"""Multi-task learning on one shared base: SST-5 / QQP / STS-B style recipes.

config.py    the tasks and the trainer's settings (configs/multitask.yaml)
graph.py     the progressive-sharing dependency graph (order, cycles)
heads.py     the seed heads (sentiment MLP, bilinear paraphrase, cosine similarity, linear)
data.py      examples -> single / cross-encoder / bi-encoder rows and batches
schedule.py  which task's batch comes next (round-robin, proportional, joint for PCGrad)
model.py     shared base + one head per task, upstream outputs fed downstream
pcgrad.py    gradient surgery on the shared parameters
smart.py     SMART: adversarial smoothness + Bregman proximal point against an EMA copy
trainer.py   one training run of a multi-task config
compare.py   `adalayers compare-multitask`: the recipes side by side, and AdaLayers
"""
