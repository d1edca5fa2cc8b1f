// The one translation unit that compiles the non-template parts of Boost.Asio (with its TLS
// layer) and Boost.Beast. Every target that includes them gets BOOST_ASIO_SEPARATE_COMPILATION and
// BOOST_BEAST_SEPARATE_COMPILATION from ppx_asio (src/CMakeLists.txt), so the other files compile
// only the declarations and the templates they instantiate, not the libraries' whole
// implementation each (about a fifth of a Beast-heavy file's compile time).
#include <boost/asio/impl/src.hpp>
#include <boost/asio/ssl/impl/src.hpp>
#include <boost/beast/src.hpp>
