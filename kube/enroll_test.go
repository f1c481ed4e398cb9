package kube

import (
	"context"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// The checks on what the API server says of a token; the API server's
// own answers are tested in kube/e2e (TestNodeEnrollment).
func TestTokenReviewerNodeOf(t *testing.T) {
	agent := authenticationv1.UserInfo{Username: "system:serviceaccount:rewind:rewind-agent",
		Extra: map[string]authenticationv1.ExtraValue{NodeNameExtra: {"gpu-1"}}}
	cases := map[string]struct {
		status authenticationv1.TokenReviewStatus
		node   string
		err    string
	}{
		"an agent's token bound to a pod on gpu-1": {status: authenticationv1.TokenReviewStatus{Authenticated: true, User: agent, Audiences: []string{"rewind"}}, node: "gpu-1"},
		"not authenticated":                        {status: authenticationv1.TokenReviewStatus{Error: "token expired"}, err: "token expired"},
		"another audience":                         {status: authenticationv1.TokenReviewStatus{Authenticated: true, User: agent, Audiences: []string{"https://kubernetes.default.svc"}}, err: `not for audience "rewind"`},
		"another account": {status: authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: []string{"rewind"},
			User: authenticationv1.UserInfo{Username: "system:serviceaccount:ml:default", Extra: agent.Extra}}, err: "not the agents' service account"},
		"bound to no pod": {status: authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: []string{"rewind"},
			User: authenticationv1.UserInfo{Username: agent.Username}}, err: "bound to no pod"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			cs := fake.NewClientset()
			cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
				tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview)
				if tr.Spec.Token != "tok" || len(tr.Spec.Audiences) != 1 || tr.Spec.Audiences[0] != "rewind" {
					t.Errorf("review of %q for %v", tr.Spec.Token, tr.Spec.Audiences)
				}
				tr = tr.DeepCopy()
				tr.Status = c.status
				return true, tr, nil
			})
			r := &TokenReviewer{Client: cs, Audience: "rewind", ServiceAccount: "rewind/rewind-agent"}
			node, err := r.NodeOf(context.Background(), "tok")
			switch {
			case c.err == "" && (err != nil || node != c.node):
				t.Fatalf("NodeOf = %q, %v; want %q", node, err, c.node)
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Fatalf("NodeOf = %q, %v; want an error with %q", node, err, c.err)
			}
		})
	}
}
