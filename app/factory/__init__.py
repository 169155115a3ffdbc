"""The Factory domain: objectives as receipt streams, plans as validated DAGs, objective control.

Pure modules (no I/O): ``vocab`` (statuses, receipt types, ids), ``plan`` (DAG validation),
``reducer`` (objective fold), ``control`` (the control decision), ``audit`` (the report).
I/O around them: ``storage`` (streams ``objectives/<id>`` + the ``objectives`` and
``objective_tasks`` projections, written in the receipt's transaction) and ``service`` (launch,
cancel, the control step, the outbox fast path, redrive and resume passes, the audit job).
"""
