"""Foundations every layer may use: errors, atomic writes, hashing, the plug-in registry, hyper-parameters,
run-directory guards, seeding and the callback protocol with the trainer's typed view.
"""
