"""The admission webhook's HTTP side: a thin shell around `webhook.core.admission.admit`.

review.py (AdmissionReview wire format and response builders), admission.py (fast path, core call,
metrics, log line), app.py (Flask app factory and blueprints), source.py (where snapshots come from),
metrics.py, logs.py, policyholder.py, tls.py (reloading certificates), gunicorn_app.py (running it).
"""
