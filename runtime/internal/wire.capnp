# Messages between the driver and its workers. Every message on a channel is one
# Envelope, framed by Cap'n Proto's standard stream framing. Tensors above
# kInlineTensorBytes travel in shared memory: a memfd passed with SCM_RIGHTS
# alongside the message that first needs it (see shm_pool.h).
@0xd4c1b7a9e2f30a11;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("baton::wire");

struct Value {
  union {
    none @0 :Void;
    bool @1 :Bool;
    int @2 :Int64;
    float @3 :Float64;
    string @4 :Text;
    list @5 :List(Value);
    dict @6 :List(Entry);
    tensor @7 :Tensor;
  }
}

struct Entry {
  key @0 :Text;
  value @1 :Value;
}

struct Tensor {
  dtype @0 :Int8;          # c10::ScalarType
  shape @1 :List(Int64);
  union {
    inline @2 :Data;       # small tensors: the bytes themselves
    shared @3 :SharedBytes;
  }
}

# Bytes in a shared-memory segment owned by the sender. The receiver maps the
# segment, and when it no longer needs the bytes it lists the segment id in
# the `released` field of a later message to the sender.
struct SharedBytes {
  segment @0 :UInt64;      # sender-unique id
  fdIndex @1 :Int32;       # index into this message's passed fds
  offset @2 :UInt64;
  length @3 :UInt64;
}

# The classes a worker process hosts (see role_set.h): one entry with an
# empty role for a plain group, one per role for a colocated one.
struct Init {
  roles @0 :List(RoleInit);
}

struct RoleInit {
  role @0 :Text;
  className @1 :Text;
  initArgs @2 :List(Value);
}

struct Call {
  callId @0 :UInt64;
  method @1 :Text;
  args @2 :List(Value);
}

struct Error {
  kind @0 :ErrorKind;
  message @1 :Text;
}

enum ErrorKind {
  exception @0;     # the method threw
  badCall @1;       # unknown method or arguments that do not match
  initFailed @2;    # the worker's constructor threw
}

struct Result {
  callId @0 :UInt64;
  union {
    value @1 :Value;
    error @2 :Error;
  }
}

struct Envelope {
  # Segments of the receiver's that the sender no longer uses.
  released @0 :List(UInt64);
  # How many file descriptors travel with this message: the message's segment
  # (every large tensor copied for it shares one) first, if there is one, then
  # one memfd per distinct shared tensor memory passed by reference
  # (shared_tensor.h; their segment ids have the high bit set).
  fdCount @1 :UInt32;
  # Bytes of that segment the message uses; the receiver maps just these.
  sharedBytes @2 :UInt64;
  # That segment's id (0: no segment). A relay between machines keeps its
  # copy of a segment under this id and reuses it (runtime/cluster/relay.h).
  segment @8 :UInt64;
  union {
    init @3 :Init;
    call @4 :Call;
    result @5 :Result;
    shutdown @6 :Void;
    release @7 :Void;   # carries only `released`
  }
}

# Between the driver and a node agent (baton-agent) on another machine, over
# an authenticated TCP connection (runtime/cluster/cluster.h). The agent opens it and
# sends `hello` on one connection (which only the agent writes) and `control`
# on a second (which only the driver writes: a TLS connection may not be
# written and read from two threads at once); the driver asks it to spawn and
# kill workers; the agent reports their pids, their output and their exit
# statuses. Each worker's own
# messages (the Envelopes above) then travel over a TCP connection of their
# own, which the agent opens with `attach` (runtime/cluster/relay.h).
struct AgentMessage {
  union {
    hello @0 :AgentHello;
    spawn @1 :AgentSpawn;
    spawned @2 :AgentSpawned;
    spawnFailed @3 :AgentSpawnFailed;
    output @4 :AgentOutput;
    exited @5 :AgentExited;
    kill @6 :UInt64;        # a worker id
    attach @7 :AgentAttach; # first message of a worker's data connection
    shutdown @8 :Void;      # the driver is done: kill what is left and exit
    control @9 :UInt64;     # first message of the agent's second control
                            # connection (the driver writes it): its hello's session
    refused @10 :Text;      # the driver's answer there to an agent it refused
  }
}

struct AgentHello {
  version @0 :UInt32;
  hostname @1 :Text;
  nodeRank @2 :Int32;     # -1: the driver numbers nodes in order of arrival
  cpuSlots @3 :Int32;     # usable cores
  gpus @4 :Int32;         # GPUs the agent may hand out (its CUDA_VISIBLE_DEVICES)
  pid @5 :Int32;
  session @6 :UInt64;     # random: names this agent's second control connection
}

struct AgentSpawn {
  workerId @0 :UInt64;
  exe @1 :Text;           # the driver's executable: the same path on every node
  argv @2 :List(Text);
  env @3 :List(Text);     # "KEY=value": the runtime's variables, over the agent's own
  label @4 :Text;         # "worker Adder rank 2", for the agent's messages
}

struct AgentAttach {
  workerId @0 :UInt64;
  toWorker @1 :Bool;      # each direction has a connection of its own
}

struct AgentSpawned {
  workerId @0 :UInt64;
  pid @1 :Int32;
}

struct AgentSpawnFailed {
  workerId @0 :UInt64;
  message @1 :Text;
}

struct AgentOutput {
  workerId @0 :UInt64;
  stderr @1 :Bool;
  data @2 :Data;
}

struct AgentExited {
  workerId @0 :UInt64;
  waitStatus @1 :Int32;   # as waitpid reports it
}
