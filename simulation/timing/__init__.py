"""Virtual time: the clocks, the device models and the wireless channel of a simulated run.

The interfaces that strategies see (:class:`strategies.core.clock.Clock`, what time
it is; :class:`strategies.core.clock.Timing`, how long a client's work takes) live
on the strategies' floor; their implementations live here, one concern a module:

* :mod:`simulation.timing.clocks`: :class:`~simulation.timing.clocks.VirtualClock`
  (simulation) and :class:`~simulation.timing.clocks.WallClock` (deployment);
* :mod:`simulation.timing.durations`: work to seconds,
  :class:`~simulation.timing.durations.DeviceTiming` (device profiles and
  stragglers) and :class:`~simulation.timing.durations.ZeroTiming` (wall clock);
* :mod:`simulation.timing.profiles`: :class:`~simulation.timing.profiles.DeviceProfile`,
  one client's device;
* :mod:`simulation.timing.devices`: the heterogeneity models (the
  ``heterogeneity`` config key) that draw the profiles;
* :mod:`simulation.timing.channels`: the GAS paper's wireless channel (path
  loss and Shannon rate).

:func:`simulation.server_app.run_server` picks a clock and a timing for a run.

Imports: ``fl_app``, ``strategies`` and ``simulation``; nothing from ``benchmarks``.
"""
