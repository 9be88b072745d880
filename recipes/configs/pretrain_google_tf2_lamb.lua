-- The TensorFlow 2 recipe's LAMB example (NVIDIA DeepLearningExamples
-- TensorFlow2 BERT, scripts/run_pretraining_lamb.sh 60 10 8 7.5e-4 5e-4 fp16
-- false 8 2000 200 7820 100 64 192 large), Google's BERT settings otherwise:
-- 7820 steps split 90% / 10% between the phases, warmup in steps (2000 / 200),
-- global batches 8 GPUs x 60 x 64 = 30720 and 8 x 10 x 192 = 15360, and
-- linear decay after warmup (power 1, polynomial_decay in Google's optimization.py).
--   bertlua recipes/pretrain.lua --config=recipes/configs/pretrain_google_tf2_lamb.lua \
--     --data-phase1=... --data-phase2=...
return {
  model = "large",
  seq1 = 128, pred1 = 20, batch1 = 30720, lr1 = 7.5e-4, warmup_steps1 = 2000, steps1 = 7038,
  seq2 = 512, pred2 = 80, batch2 = 15360, lr2 = 5e-4, warmup_steps2 = 200, steps2 = 782,
  power = 1.0, weight_decay = 0.01, max_grad_norm = 1.0, loss_scale = "dynamic",
}
