package kube

import (
	"context"
	"fmt"
	"slices"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// NodeNameExtra is the key of a TokenReview's user extra under which the
// API server names the node of the pod a service-account token is bound
// to (Kubernetes 1.30 and later).
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// TokenReviewer tells which node an agent runs on from the projected
// service-account token its pod mounts: the API server checks the token
// (TokenReview) and names the node of the pod it is bound to. It is the
// coordinator's enrollment check in Kubernetes (coordinator.EnrollConfig):
// a token proves a node only if it is the agents' service account's, for
// the enrollment audience, and bound to a pod on that node.
type TokenReviewer struct {
	Client kubernetes.Interface
	// Audience the token must be issued for: the agents' projected
	// token names it, so that no other token of theirs (the default
	// one, which the API server accepts) enrolls.
	Audience string
	// ServiceAccount is the agents' service account, NAMESPACE/NAME.
	ServiceAccount string
}

// NodeOf returns the node token proves, or why it proves none.
func (r *TokenReviewer) NodeOf(ctx context.Context, token string) (string, error) {
	tr, err := r.Client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{r.Audience}}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("kube: token review: %w", err)
	}
	st := tr.Status
	ns, name, _ := strings.Cut(r.ServiceAccount, "/")
	want := "system:serviceaccount:" + ns + ":" + name
	nodes := st.User.Extra[NodeNameExtra]
	switch {
	case !st.Authenticated:
		why := st.Error
		if why == "" {
			why = "not authenticated"
		}
		return "", fmt.Errorf("kube: token review: %s", why)
	case !slices.Contains(st.Audiences, r.Audience):
		return "", fmt.Errorf("kube: the token is not for audience %q (it is for %v)", r.Audience, st.Audiences)
	case st.User.Username != want:
		return "", fmt.Errorf("kube: the token is %s's, not the agents' service account %s", st.User.Username, want)
	case len(nodes) != 1 || nodes[0] == "":
		return "", fmt.Errorf("kube: the token is bound to no pod on a node (user extra %s is %v): mount a projected service-account token", NodeNameExtra, nodes)
	}
	return nodes[0], nil
}

// ParseServiceAccount checks a NAMESPACE/NAME service account.
func ParseServiceAccount(s string) error {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("kube: service account %q: want NAMESPACE/NAME", s)
	}
	return nil
}
