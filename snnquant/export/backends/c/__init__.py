"""The C generator behind :func:`~snnquant.export.to_c`: :mod:`.generator` schedules a network
and writes its files; one emitter per operation kind writes that operation's C."""
