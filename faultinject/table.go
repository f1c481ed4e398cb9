package faultinject

// Point is a named fault point: a place in the code where an Injector may
// fire, with the kinds of fault that mean something there.
type Point struct {
	Name  string
	Where string // the code that asks, in words
	Shows string // what firing it tests
	Kinds []Kind // the kinds a spec may arm here
}

// The fault points. Each sits at a durability or hand-off boundary; the
// names say which side of it.
const (
	// Agent: a rank's save.
	AgentShardCopied      = "agent/shard-copied"
	AgentCommittedUnsent  = "agent/committed-unreported"
	AgentReplicaReceived  = "agent/replica-received"
	AgentReplicaStored    = "agent/replica-stored"
	AgentTierUploaded     = "agent/tier-uploaded"
	AgentTierManifest     = "agent/tier-manifest-written"
	AgentRestoreFetched   = "agent/restore-fetched"
	CoordBeforeConsistent = "coordinator/before-consistent"
	CoordConsistentStored = "coordinator/consistent-stored"
	CoordBeforeTierRecord = "coordinator/before-tier-record"
	CoordBeforeRegang     = "coordinator/before-regang"
	CoordResumeSent       = "coordinator/resume-sent"

	// Injectors: the file system, the object store, the gossip network.
	FSShmAllocate = "fs/shm/allocate"
	FSTierWrite   = "fs/tier/write"
	FSTierSync    = "fs/tier/sync"
	FSTierRename  = "fs/tier/rename"
	S3Request     = "s3/request"
	GossipSend    = "gossip/send"
)

var (
	crashKinds   = []Kind{KindExit, KindPanic, KindSleep}
	processKinds = []Kind{KindError, KindExit, KindPanic, KindSleep}
	dataKinds    = []Kind{KindError, KindExit, KindPanic, KindSleep, KindCorrupt}
)

// Points is the table of every fault point. A test fails when a point in
// it is never fired by any test (see Recorder).
var Points = []Point{
	{AgentShardCopied, "agent Commit, after the rank copied its shard into the slot, before the commit is recorded",
		"a save cut off before its commit: the rank's previous checkpoint stays the latest", processKinds},
	{AgentCommittedUnsent, "agent Commit, after the commit is recorded, before it is reported to the coordinator",
		"a commit the coordinator never heard of: the restarted agent re-sends its inventory", crashKinds},
	{AgentReplicaReceived, "agent peer copy, after a shard's bytes arrived from a peer, before they are checked",
		"a replica damaged in flight is refused, never committed", dataKinds},
	{AgentReplicaStored, "agent peer copy, after a replica is checked and committed, before it is reported",
		"a replica rotting in memory: a restore from it notices and falls back to the next copy", dataKinds},
	{AgentTierUploaded, "agent tier transfer, after a shard is uploaded, before the tier's manifest is written",
		"an upload without its manifest is no tier copy", processKinds},
	{AgentTierManifest, "agent tier transfer, after the manifest is written, before the copy is reported",
		"a tier copy the coordinator was not told of is not counted durable", processKinds},
	{AgentRestoreFetched, "agent restore, before a source of the plan is used",
		"a source that fails is passed over for the next one in the plan", processKinds},
	{CoordBeforeConsistent, "coordinator, before a step that every rank committed is recorded consistent",
		"a coordinator crash mid-commit: agents re-report and the step becomes consistent once", processKinds},
	{CoordConsistentStored, "coordinator, after a step's consistency is stored (synced), before any answer tells it",
		"a crash between the decision and its answers: the successor answers the step, nothing answered goes back", processKinds},
	{CoordBeforeTierRecord, "coordinator, before a reported tier copy is recorded durable",
		"a tier copy reported but not recorded is re-reported, never lost", processKinds},
	{CoordBeforeRegang, "coordinator recovery, after every shard was placed, before the ranks are told to restart",
		"a recovery cut off at its last step is redone by the next coordinator", processKinds},
	{CoordResumeSent, "coordinator order stream, after a resume order was taken for an agent, before it is sent",
		"a resume lost with its stream (error: the stream ends) is sent again when the agent reconnects: no agent stays broken", processKinds},
	{FSShmAllocate, "shm file system (Faulty FS named shm): reserving a segment's space",
		"a full /dev/shm is an error at allocation, never a SIGBUS", []Kind{KindError, KindSleep}},
	{FSTierWrite, "file tier file system (Faulty FS named tier): a write",
		"EIO, ENOSPC, short and torn writes on NVMe or the parallel filesystem",
		[]Kind{KindError, KindSleep, KindShort, KindTorn, KindCorrupt}},
	{FSTierSync, "file tier file system: fsync", "a failed fsync loses nothing that was durable",
		[]Kind{KindError, KindSleep}},
	{FSTierRename, "file tier file system: the rename that publishes a file", "a failed publish leaves the old file",
		[]Kind{KindError, KindSleep}},
	{S3Request, "object store HTTP transport (Transport): every request",
		"5xx answers, resets, timeouts, latency and corrupted bodies from S3",
		[]Kind{KindError, KindSleep, KindStatus, KindReset, KindTimeout, KindCorrupt}},
	{GossipSend, "membership transport: every packet and stream this member sends",
		"loss and delay between members: suspicion, then death", []Kind{KindDrop, KindSleep, KindReset}},
}

// lookup returns the point named name.
func lookup(name string) (*Point, bool) {
	for i := range Points {
		if Points[i].Name == name {
			return &Points[i], true
		}
	}
	return nil, false
}
