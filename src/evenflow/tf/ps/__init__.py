"""Parameter-server training: the cluster, the chief's session and engine, the models the servers hold, the launcher.

Internal: ``evenflow train --strategy ps`` and ``evenflow launch --ps`` reach it through :mod:`evenflow.tf`.
"""
