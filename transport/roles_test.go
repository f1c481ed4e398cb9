package transport

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
)

// readerMay are the methods a reader's certificate calls: reads only. A
// method added to either service is refused to readers by this test until
// it is named here, which says that it changes nothing.
var readerMay = map[string]bool{
	coordpb.Coordinator_Latest_FullMethodName:      true,
	coordpb.Coordinator_ListJobs_FullMethodName:    true,
	coordpb.Coordinator_ListSteps_FullMethodName:   true,
	coordpb.Coordinator_InspectStep_FullMethodName: true,
	coordpb.Coordinator_VerifyStep_FullMethodName:  true,
	coordpb.Coordinator_TierStatus_FullMethodName:  true,
	coordpb.Coordinator_WatchJob_FullMethodName:    true,
	coordpb.Coordinator_Audit_FullMethodName:       true,
	coordpb.Coordinator_Nodes_FullMethodName:       true,
	agentpb.Agent_List_FullMethodName:              true,
	agentpb.Agent_Status_FullMethodName:            true,
	agentpb.Agent_Verify_FullMethodName:            true,
	agentpb.Agent_TierCopies_FullMethodName:        true,
	// Not a read, but its caller is authenticated by the token in the
	// request, whatever its certificate (coordinator/enroll.go).
	coordpb.Coordinator_Enroll_FullMethodName: true,
}

// nodeMayNameOthers are the methods whose request names a node that a
// node's certificate may name for another: Enroll names the node its
// token proves, which the handler checks.
var nodeMayNameOthers = map[string]bool{coordpb.Coordinator_Enroll_FullMethodName: true}

// TestNoMethodLetsAReaderChangeOrANodeSpeakForAnother calls every method
// of both services, found in their descriptors, by hand over mutual TLS:
// with a reader's certificate, and with node-a's own certificate in a
// request that names node-b wherever a request can name a node (a node
// field, a placement, each element of a list of records). A reader is
// refused every method but readerMay's; node-a is refused every request
// that names node-b, though the same request naming node-a passes where
// nodes may call the method. So a method added without its role, or
// without the check that keeps a node to itself, fails here.
func TestNoMethodLetsAReaderChangeOrANodeSpeakForAnother(t *testing.T) {
	p := newPKI(t)
	addr := serve(t, p.sec(Identity{RoleCoordinator, "coord"}))
	reader := dialAs(t, p.sec(Identity{RoleReader, "bob"}), addr)
	nodeA := dialAs(t, p.sec(Identity{RoleNode, "node-a"}), addr)
	methods := 0
	for _, sd := range []grpc.ServiceDesc{coordpb.Coordinator_ServiceDesc, agentpb.Agent_ServiceDesc} {
		svc := serviceOf(t, sd.ServiceName)
		for i := range svc.Methods().Len() {
			m := svc.Methods().Get(i)
			full := "/" + sd.ServiceName + "/" + string(m.Name())
			methods++
			t.Run(string(m.Name()), func(t *testing.T) {
				code := invoke(t, reader, m, full, newMessage(t, m.Input()))
				if readerMay[full] != (code != codes.PermissionDenied) {
					t.Errorf("a reader calls %s: %v; readers may call it: %v", full, code, readerMay[full])
				}
				other := newMessage(t, m.Input())
				if !nameNode(other.ProtoReflect(), "node-b") || nodeMayNameOthers[full] {
					return
				}
				if code := invoke(t, nodeA, m, full, other); code != codes.PermissionDenied {
					t.Errorf("node-a calls %s naming node-b: %v, want PermissionDenied", full, code)
				}
				self := newMessage(t, m.Input())
				nameNode(self.ProtoReflect(), "node-a")
				nodes := false
				for _, r := range Rules[full].Roles {
					nodes = nodes || r == RoleNode
				}
				if code := invoke(t, nodeA, m, full, self); nodes && code == codes.PermissionDenied {
					t.Errorf("node-a calls %s naming itself: %v", full, code)
				}
			})
		}
	}
	if methods < 30 {
		t.Fatalf("found %d methods in the services' descriptors", methods)
	}
}

func serviceOf(t *testing.T, name string) protoreflect.ServiceDescriptor {
	t.Helper()
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
	if err != nil {
		t.Fatal(err)
	}
	return d.(protoreflect.ServiceDescriptor)
}

func newMessage(t *testing.T, d protoreflect.MessageDescriptor) proto.Message {
	t.Helper()
	mt, err := protoregistry.GlobalTypes.FindMessageByName(d.FullName())
	if err != nil {
		t.Fatal(err)
	}
	return mt.New().Interface()
}

// nameNode sets every field of m that names a node to node: a string
// field "node", a message field "node"'s name, a placement's rank 0, and
// one new element of each list of messages that can name one. It reports
// whether m can name a node at all.
func nameNode(m protoreflect.Message, node string) bool {
	named := false
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		switch {
		case f.Name() == "node" && f.Kind() == protoreflect.StringKind && !f.IsList():
			m.Set(f, protoreflect.ValueOfString(node))
			named = true
		case f.Name() == "node" && f.Message() != nil && !f.IsList() && !f.IsMap():
			n := m.Mutable(f).Message()
			if name := n.Descriptor().Fields().ByName("name"); name != nil {
				n.Set(name, protoreflect.ValueOfString(node))
				named = true
			}
		case f.Name() == "placement" && f.IsMap() && f.MapValue().Kind() == protoreflect.StringKind:
			m.Mutable(f).Map().Set(protoreflect.ValueOfUint32(0).MapKey(), protoreflect.ValueOfString(node))
			named = true
		case f.IsList() && f.Message() != nil:
			el := m.Mutable(f).List().NewElement()
			if nameNode(el.Message(), node) {
				m.Mutable(f).List().Append(el)
				named = true
			}
		}
	}
	return named
}

// invoke calls method full with req, as a unary call or as a stream that
// sends req and reads one answer, and returns the call's code.
func invoke(t *testing.T, conn *grpc.ClientConn, m protoreflect.MethodDescriptor, full string, req proto.Message) codes.Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reply := newMessage(t, m.Output())
	if !m.IsStreamingClient() && !m.IsStreamingServer() {
		return status.Code(conn.Invoke(ctx, full, req, reply))
	}
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: m.IsStreamingClient(), ServerStreams: m.IsStreamingServer()}, full)
	if err == nil {
		err = s.SendMsg(req)
	}
	if err == nil {
		err = s.CloseSend()
	}
	if err == nil {
		err = s.RecvMsg(reply)
	}
	return status.Code(err)
}

func dialAs(t *testing.T, s *Security, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := s.NewClient(addr, ExpectCoordinator)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
