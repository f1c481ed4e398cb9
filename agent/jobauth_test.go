package agent

import (
	"testing"

	"rewind.dev/rewind/api/agentpb"
)

// TestEveryMethodHasAJob: every method of the Agent service says, in
// socketJobs, which job a call over the socket acts on; a new method
// fails here until it is given one (until then the socket refuses it).
func TestEveryMethodHasAJob(t *testing.T) {
	var names []string
	for _, m := range agentpb.Agent_ServiceDesc.Methods {
		names = append(names, m.MethodName)
	}
	for _, s := range agentpb.Agent_ServiceDesc.Streams {
		names = append(names, s.StreamName)
	}
	for _, n := range names {
		if _, ok := socketJobs["/"+agentpb.Agent_ServiceDesc.ServiceName+"/"+n]; !ok {
			t.Errorf("Agent.%s has no entry in socketJobs", n)
		}
	}
	if len(socketJobs) != len(names) {
		t.Errorf("socketJobs has %d entries, the service %d methods", len(socketJobs), len(names))
	}
}
