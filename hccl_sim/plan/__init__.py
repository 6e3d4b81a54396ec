"""From a collective call to what runs: the planner composes selection, the loop programs
(`loop_programs`, built from hccl_sim.algorithms) and the cost model into an OpPlan (`planner`);
the event-driven replay of a plan gives step clocks and traces (`event_replay`); `faulted` binds a
fault plan to the topology an op is priced on and finds the crash it puts in an op; `lowering`
turns an OpPlan into the DataProgram that hcomm's byte movers run."""
