-- NVIDIA DeepLearningExamples PyTorch BERT-large pre-training with LAMB
-- (scripts/run_pretraining.sh): the defaults of recipes/pretrain.lua, written
-- out so a run can name them. Global batches 65536 / 32768 = 8 GPUs x
-- micro-batch x accumulation; warmup as a proportion of each phase.
--   bertlua recipes/pretrain.lua --config=recipes/configs/pretrain_nvidia_pytorch.lua \
--     --data-phase1=... --data-phase2=...
return {
  model = "large",
  seq1 = 128, pred1 = 20, batch1 = 65536, lr1 = 6e-3, warmup1 = 0.2843, warmup_steps1 = -1, steps1 = 7038,
  seq2 = 512, pred2 = 80, batch2 = 32768, lr2 = 4e-3, warmup2 = 0.128, warmup_steps2 = -1, steps2 = 1563,
  power = 0.5, weight_decay = 0.01, max_grad_norm = 1.0, loss_scale = "dynamic",
}
